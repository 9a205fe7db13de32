//! Tiny random 2-layer Llama models written by the test itself: every supported weight type,
//! grouped-query attention, tied and untied output heads — without the 98 MB file.

mod tiny;

use straddle_engine::gguf::Gguf;
use straddle_engine::quant::TensorType;
use straddle_engine::{BlockingLm, Chunk, KvCache, Model, ModelError};
use tiny::VOCAB;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn batched_prefill_equals_token_by_token_decode_for_every_type() {
    let tokens = [3u32, 17, 5, 39, 0, 22];
    for ty in [
        TensorType::F32,
        TensorType::F16,
        TensorType::BF16,
        TensorType::Q8_0,
        TensorType::Q4_0,
        TensorType::Q4_1,
        TensorType::Q4_K,
        TensorType::Q6_K,
    ] {
        for (heads, kv_heads) in [(4, 4), (4, 2), (4, 1)] {
            let g = Gguf::read(tiny::model(ty, heads, kv_heads, false)).expect("tiny gguf");
            let m = Model::load(&g, 64).expect("load");
            let mut batch_cache = m.new_cache(64);
            let batched = m.forward(&tokens, &mut batch_cache, true).expect("prefill");
            let mut step_cache = m.new_cache(64);
            for (t, &tok) in tokens.iter().enumerate() {
                let step = m
                    .forward(&[tok], &mut step_cache, false)
                    .expect("decode")
                    .pop()
                    .expect("logits");
                let diff = max_diff(&step, &batched[t]);
                assert!(
                    diff < 1e-4,
                    "{ty:?} heads {heads}/{kv_heads} position {t}: diff {diff}"
                );
            }
            assert!(batched.iter().flatten().all(|v| v.is_finite()));
        }
    }
}

#[test]
fn untied_head_with_the_embedding_values_gives_tied_logits() {
    let tied = Model::load(
        &Gguf::read(tiny::model(TensorType::Q8_0, 4, 2, false)).expect("gguf"),
        64,
    )
    .expect("tied");
    let untied = Model::load(
        &Gguf::read(tiny::model(TensorType::Q8_0, 4, 2, true)).expect("gguf"),
        64,
    )
    .expect("untied");
    let a = tied
        .forward(&[1, 2, 3], &mut tied.new_cache(16), false)
        .expect("tied fwd");
    let b = untied
        .forward(&[1, 2, 3], &mut untied.new_cache(16), false)
        .expect("untied fwd");
    assert_eq!(a, b);
}

#[test]
fn context_overflow_and_bad_token_are_errors() {
    let m = Model::load(
        &Gguf::read(tiny::model(TensorType::Q4_1, 4, 2, false)).expect("gguf"),
        64,
    )
    .expect("load");
    let mut cache = m.new_cache(4);
    assert!(matches!(
        m.forward(&[1, 2, 3, 4, 5], &mut cache, false),
        Err(ModelError::ContextFull { .. })
    ));
    assert!(matches!(
        m.forward(&[VOCAB as u32], &mut m.new_cache(4), false),
        Err(ModelError::BadToken(_))
    ));
}

#[test]
fn wrong_tensor_shape_is_named() {
    let mut bytes = tiny::model(TensorType::F32, 4, 4, false);
    // Rewrite the declared rows of blk.0.attn_q (64×64) to 32 by patching its shape in the header.
    let name = b"blk.0.attn_q.weight";
    let pos = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("name")
        + name.len()
        + 4
        + 8;
    bytes[pos..pos + 8].copy_from_slice(&32u64.to_le_bytes());
    let err = Model::load(&Gguf::read(bytes).expect("still a valid GGUF"), 64).unwrap_err();
    assert!(
        matches!(&err, ModelError::Shape { name, .. } if name == "blk.0.attn_q.weight"),
        "{err}"
    );
}

#[test]
fn batched_decode_across_sequences_equals_decoding_each_alone() {
    let g = Gguf::read(tiny::model(TensorType::Q4_1, 4, 2, false)).expect("gguf");
    let m = Model::load(&g, 64).expect("load");
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[9], &[4, 4, 4, 4, 4]];
    let mut alone = Vec::new();
    let mut caches = Vec::new();
    for p in prompts {
        let mut c = m.new_cache(32);
        m.forward(p, &mut c, false).expect("prefill");
        let mut solo = c.clone();
        alone.push(
            m.forward(&[7], &mut solo, false)
                .expect("solo")
                .pop()
                .expect("logits"),
        );
        caches.push(c);
    }
    let steps: Vec<Chunk> = caches
        .iter()
        .map(|c| Chunk {
            tokens: &[7],
            pass: c.len()..c.len() + 1,
            want_logits: true,
        })
        .collect();
    let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
    let batched: Vec<Vec<f32>> = m
        .forward_chunks_blocking(&steps, &mut refs)
        .expect("batch")
        .into_iter()
        .map(|logits| logits.expect("logits"))
        .collect();
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert!(max_diff(a, b) < 1e-4, "sequence {i}: {}", max_diff(a, b));
    }
    assert_eq!(
        caches.iter().map(|c| c.len()).collect::<Vec<_>>(),
        vec![4, 2, 6]
    );
}

#[test]
fn gemma3_batched_prefill_equals_token_by_token_decode() {
    let tokens = [3u32, 17, 5, 39, 0, 22, 9, 31, 14];
    // Seven layers: six sliding-window ones around the sixth, global, one.
    let g = Gguf::read(tiny::gemma3(TensorType::Q5_0, 7, 3)).expect("tiny gemma3");
    let m = Model::load(&g, 64).expect("load");
    assert_eq!(m.config.window(0), Some(3));
    assert_eq!(m.config.window(5), None);
    let mut batch_cache = m.new_cache(64);
    let batched = m.forward(&tokens, &mut batch_cache, true).expect("prefill");
    let mut step_cache = m.new_cache(64);
    for (t, &tok) in tokens.iter().enumerate() {
        let step = m.forward(&[tok], &mut step_cache, false).expect("decode");
        let diff = max_diff(&step[0], &batched[t]);
        assert!(diff < 1e-4, "position {t}: diff {diff}");
    }
}

#[test]
fn gemma3_sliding_window_forgets_what_fell_out_of_it() {
    // Two sliding-window layers of 3 positions: position 8 sees back to position 4 at most,
    // so a different first token cannot change its logits; it must change position 2's.
    let g = Gguf::read(tiny::gemma3(TensorType::Q8_0, 2, 3)).expect("tiny gemma3");
    let m = Model::load(&g, 64).expect("load");
    let logits = |first: u32| {
        let tokens = [first, 17, 5, 39, 0, 22, 9, 31, 14];
        m.forward(&tokens, &mut m.new_cache(64), true)
            .expect("forward")
    };
    let (a, b) = (logits(3), logits(30));
    assert_eq!(a[8], b[8], "position 8 saw a token outside its window");
    assert!(
        max_diff(&a[2], &b[2]) > 1e-3,
        "position 2 must see position 0"
    );
}

#[test]
fn gemma3_with_a_lying_head_size_is_a_typed_error() {
    let bytes = tiny::gemma3_with_lying_heads();
    let err = Model::load(&Gguf::read(bytes).expect("still a valid GGUF"), 64).unwrap_err();
    assert!(matches!(&err, ModelError::Shape { .. }), "{err}");
}

#[test]
fn an_unknown_architecture_is_named_with_the_supported_ones() {
    let mut bytes = tiny::model(TensorType::F32, 4, 4, false);
    let arch = b"llama";
    let at = bytes
        .windows(arch.len())
        .position(|w| w == arch)
        .expect("arch");
    bytes[at..at + 5].copy_from_slice(b"mamba");
    let err = Model::load(&Gguf::read(bytes).expect("still a valid GGUF"), 64).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, ModelError::UnsupportedArch(a) if a == "mamba"),
        "{text}"
    );
    for arch in straddle_engine::Arch::ALL {
        assert!(
            text.contains(arch.name()),
            "{text} does not name {}",
            arch.name()
        );
    }
}

#[test]
fn gemma3_ring_cache_gives_the_full_cache_s_logits_to_the_bit() {
    // The sliding-window layers keep their window (plus one pass) in a ring. A prompt that
    // wraps it several times, decoding, a rewound draft and a copied prefix must all give
    // exactly the logits of a cache that keeps every position.
    let g = Gguf::read(tiny::gemma3(TensorType::Q8_0, 7, 3)).expect("tiny gemma3");
    let m = Model::load(&g, 512).expect("load");
    let tokens: Vec<u32> = (0..400u32).map(|i| i * 7919 % VOCAB as u32).collect();
    let mut ring = m.new_cache(512);
    let mut full = KvCache::new(m.config.n_layers, 512, m.config.kv_dim());
    assert!(
        ring.bytes() < full.bytes() / 2,
        "the window layers hold less"
    );
    let (a, b) = (
        m.forward(&tokens, &mut ring, true).expect("ring"),
        m.forward(&tokens, &mut full, true).expect("full"),
    );
    assert_eq!(a, b, "prefill");
    let mut copy = ring
        .prefix(ring.len())
        .expect("the ring holds the last window");
    assert!(ring.prefix(8).is_none(), "an early prefix was overwritten");
    copy.reserve(512);
    for step in [[5u32, 9, 11].as_slice(), &[13], &[2, 4]] {
        let want = m.forward(step, &mut full, true).expect("full");
        assert_eq!(
            m.forward(step, &mut ring, true).expect("ring"),
            want,
            "{step:?}"
        );
        assert_eq!(
            m.forward(step, &mut copy, true).expect("copy"),
            want,
            "{step:?}"
        );
        // A rejected draft: its last token is forgotten and run again.
        for cache in [&mut full, &mut ring, &mut copy] {
            cache.truncate(cache.len() - 1);
        }
        let again = &step[step.len() - 1..];
        let want = m.forward(again, &mut full, false).expect("full");
        assert_eq!(m.forward(again, &mut ring, false).expect("ring"), want);
        assert_eq!(m.forward(again, &mut copy, false).expect("copy"), want);
    }
}

#[test]
fn the_memory_a_header_names_is_what_the_loaded_model_holds() {
    use straddle_engine::{MIN_CONTEXT, MemoryNeed};
    // Sliding-window layers keep a ring, global ones every position: both counted.
    let bytes = tiny::gemma3_with_context(TensorType::Q8_0, 7, 40, 4096);
    let g = Gguf::read(bytes.clone()).expect("tiny gguf");
    let need = MemoryNeed::of(&g, 1024).expect("need");
    let m = Model::load(&g, 1024).expect("load");
    assert_eq!(need.kv_cache, m.new_cache(1024).bytes() as u64);
    let held = m.weight_bytes() as f64;
    assert!(
        (0.9..=1.05).contains(&(need.weights as f64 / held)),
        "header {} B, loaded {held} B",
        need.weights
    );
    assert_eq!(need.file, bytes.len() as u64);
    // The header alone, before the tensors' bytes, says the same.
    let head = bytes[..g.data_offset as usize].to_vec();
    let from_head = Gguf::read_prefix(head, bytes.len() as u64)
        .expect("a gguf")
        .expect("the whole header");
    assert_eq!(MemoryNeed::of(&from_head, 1024).expect("need"), need);
    // A budget between what 256 and 512 positions need gets 256; below that, 256 over it.
    let at = |c| MemoryNeed::of(&g, c).expect("need").total();
    let budget = (at(MIN_CONTEXT) + at(2 * MIN_CONTEXT)) / 2;
    let fitted = MemoryNeed::fitting(&g, 4096, budget).expect("fits");
    assert_eq!(
        (fitted.context, fitted.total() <= budget),
        (MIN_CONTEXT, true)
    );
    let over = MemoryNeed::fitting(&g, 4096, at(MIN_CONTEXT) - 1).expect("read");
    assert_eq!((over.context, over.total()), (MIN_CONTEXT, at(MIN_CONTEXT)));
    let asked_less = MemoryNeed::fitting(&g, 100, 0).expect("read");
    assert_eq!(
        asked_less.context, 100,
        "a short context asked for is not lengthened"
    );
    assert_eq!(
        MemoryNeed::of(&g, 1 << 20).expect("need").context,
        4096,
        "the trained context caps it"
    );
}
