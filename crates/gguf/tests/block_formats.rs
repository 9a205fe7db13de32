//! Every block format's dequantization, bit for bit against the reference's on random blocks
//! (`tests/reference/make_blocks.py` writes them with PyPI's `gguf` package).

use straddle_gguf::quant::{TensorType, dequantize};

fn tensor_type(name: &str) -> TensorType {
    let id = match name {
        "Q4_0" => 2,
        "Q4_1" => 3,
        "Q5_0" => 6,
        "Q5_1" => 7,
        "Q8_0" => 8,
        "Q4_K" => 12,
        "Q5_K" => 13,
        "Q6_K" => 14,
        other => panic!("the reference names a type this test does not know: {other}"),
    };
    TensorType::from_id(id).expect("a known id")
}

#[test]
fn dequantization_matches_the_reference_bit_for_bit() {
    let text = include_str!("../../../tests/reference/blocks.json");
    let reference: serde_json::Value = serde_json::from_str(text).expect("reference JSON");
    let blocks = reference["blocks"].as_object().expect("blocks by type");
    assert_eq!(blocks.len(), 8, "every format the engine reads");
    for (name, cases) in blocks {
        let ty = tensor_type(name);
        for (i, case) in cases.as_array().expect("cases").iter().enumerate() {
            let bytes = hex::decode(case["bytes"].as_str().expect("hex")).expect("hex");
            let got = dequantize(ty, &bytes).expect("dequantize");
            let want: Vec<f32> = case["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|v| v.as_f64().expect("a number") as f32)
                .collect();
            assert_eq!(got.len(), want.len(), "{name} block {i}: length");
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{name} block {i} element {j}: {g} vs {w}"
                );
            }
        }
    }
}
