//! Any byte string, read as a GGUF file: parsing, every metadata accessor, every tensor's
//! bytes and their dequantization must return (a value or a typed error) without panicking,
//! reading out of bounds or allocating beyond what the input pays for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use straddle_gguf::{Gguf, quant};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = Gguf::read(data.to_vec()) else {
        return;
    };
    for (key, value) in &file.metadata {
        let _ = (
            value.as_u64(),
            value.as_i64(),
            value.as_f64(),
            value.as_bool(),
        );
        let _ = (value.as_str(), value.as_array());
        let _ = (file.get_str(key), file.get_u64(key), file.get_f64(key));
        let _ = file.get_str_array(key);
    }
    for info in &file.tensors {
        let _ = info.elements();
        if let Ok(bytes) = file.tensor_bytes(&info.name) {
            assert_eq!(
                bytes.len() as u64,
                info.size,
                "tensor bytes differ from the directory"
            );
            let _ = quant::dequantize(info.ty, &bytes);
        }
    }
    let _ = format!("{file:?}");
});
