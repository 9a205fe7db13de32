//! Speculative decoding is exact: a Q4_0 tiny model drafts for an F32 tiny model with the same
//! random weights (so drafts are often, not always, right), and the output must be the
//! target's own — token for token when greedy, in distribution when sampled.

mod tiny;

use straddle_engine::KvCache;
use straddle_engine::Model;
use straddle_engine::gguf::Gguf;
use straddle_engine::quant::TensorType;
use straddle_engine::sample::{self, Rng, SamplingParams};
use straddle_engine::speculative::{self, DraftLength, Verdict};
use tiny::VOCAB;

fn models() -> (Model, Model) {
    let load = |bytes| Model::load(&Gguf::read(bytes).expect("tiny gguf"), 64).expect("load");
    (
        load(tiny::model(TensorType::Q4_0, 4, 2, false)),
        load(tiny::model(TensorType::F32, 4, 2, false)),
    )
}

/// Plain decoding of `n` tokens with the target: the reference.
fn reference(target: &Model, prompt: &[u32], n: usize, p: &SamplingParams, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let mut cache = target.new_cache(64);
    let mut logits = target.forward(prompt, &mut cache, false).expect("prefill")[0].clone();
    let mut ctx = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < n {
        let t = sample::sample(&logits, p, &ctx, &mut rng).token;
        out.push(t);
        ctx.push(t);
        logits = target.forward(&[t], &mut cache, false).expect("step")[0].clone();
    }
    out
}

/// Cloud side of a verify session: the target's cache, its context and the pending token.
struct Session {
    cache: KvCache,
    ctx: Vec<u32>,
    pending: Option<u32>,
    rng: Rng,
}

/// Speculative decoding of `n` tokens: the drafter drafts, the target verifies through the
/// session path (`verify` on the first call, `verify_after` with the pending token later).
/// Returns the tokens and the verify calls made.
fn speculative(
    drafter: &Model,
    target: &Model,
    prompt: &[u32],
    n: usize,
    p: &SamplingParams,
    seed: u64,
) -> (Vec<u32>, usize) {
    let mut edge = drafter.new_cache(64);
    let mut edge_logits = drafter
        .forward(prompt, &mut edge, false)
        .expect("edge prefill")[0]
        .clone();
    let mut cloud = Session {
        cache: target.new_cache(64),
        ctx: prompt.to_vec(),
        pending: None,
        rng: Rng::new(seed),
    };
    let first_logits = target
        .forward(prompt, &mut cloud.cache, false)
        .expect("prefill")[0]
        .clone();
    let mut k = DraftLength::default();
    let mut out = Vec::new();
    let mut calls = 0;
    while out.len() < n {
        let base = edge.len();
        let d = drafter
            .draft(&mut edge, &edge_logits, k.k().min(n - out.len()))
            .expect("draft");
        let v: Verdict = match cloud.pending {
            None => speculative::verify(
                target,
                &mut cloud.cache,
                &first_logits,
                &d.tokens,
                p,
                &cloud.ctx,
                &mut cloud.rng,
            ),
            Some(t) => speculative::verify_after(
                target,
                &mut cloud.cache,
                t,
                &d.tokens,
                p,
                &cloud.ctx,
                &mut cloud.rng,
            ),
        }
        .expect("verify");
        calls += 1;
        if let Some(t) = cloud.pending {
            cloud.ctx.push(t);
        }
        cloud.ctx.extend_from_slice(&d.tokens[..v.accepted]);
        cloud.pending = Some(v.next_token);
        k.record(d.tokens.len(), v.accepted, 1.0, 10.0);
        out.extend_from_slice(&d.tokens[..v.accepted]);
        out.push(v.next_token);
        edge_logits = drafter.accept(&mut edge, base, &d, &v).expect("accept");
        assert_eq!(edge.len(), prompt.len() + out.len());
    }
    out.truncate(n);
    (out, calls)
}

#[test]
fn greedy_speculative_output_is_the_targets_greedy_output() {
    let (drafter, target) = models();
    let greedy = SamplingParams::default();
    let mut calls = 0;
    let mut tokens = 0;
    for prompt in [
        vec![1u32, 2, 3],
        vec![5, 9],
        vec![39, 0, 12, 7],
        vec![20],
        vec![3, 3, 3, 3, 3],
        vec![11, 22, 33],
        vec![8, 16, 24, 32, 1],
        vec![2, 38],
    ] {
        let want = reference(&target, &prompt, 24, &greedy, 0);
        let (got, c) = speculative(&drafter, &target, &prompt, 24, &greedy, 0);
        assert_eq!(got, want, "prompt {prompt:?}");
        calls += c;
        tokens += got.len();
    }
    // The Q4_0 drafter agrees with its F32 target often enough to batch tokens.
    assert!(
        calls * 2 < tokens,
        "{calls} verify calls for {tokens} tokens"
    );
}

/// Total variation distance between two histograms of `n` draws each.
fn tv(a: &[usize], b: &[usize], n: usize) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).abs())
        .sum::<f64>()
        / (2.0 * n as f64)
}

#[test]
fn sampled_speculative_output_keeps_the_targets_distribution() {
    let (drafter, target) = models();
    let p = SamplingParams {
        temperature: 0.5,
        ..Default::default()
    };
    let prompt = [1u32, 2, 3];
    let draws = 12_000;
    let mut spec = [
        vec![0usize; VOCAB],
        vec![0usize; VOCAB],
        vec![0usize; VOCAB],
    ];
    let mut refr = spec.clone();
    for seed in 0..draws as u64 {
        let (s, _) = speculative(&drafter, &target, &prompt, 3, &p, seed);
        // An independent stream of seeds for the reference, so the two samples are independent.
        let r = reference(&target, &prompt, 3, &p, seed + 1_000_003);
        for i in 0..3 {
            spec[i][s[i] as usize] += 1;
            refr[i][r[i] as usize] += 1;
        }
    }
    // Two samples of 12 000 from one distribution over 40 tokens differ by about 0.02 in TV.
    for i in 0..3 {
        let d = tv(&spec[i], &refr[i], draws);
        assert!(d < 0.045, "position {i}: TV {d:.3}");
    }
    // The test can fail: accepting every greedy draft (no rejection) is far off.
    let greedy_first = {
        let mut c = target.new_cache(64);
        sample::argmax(&target.forward(&prompt, &mut c, false).expect("fwd")[0]) as usize
    };
    let mut always = vec![0usize; VOCAB];
    always[greedy_first] = draws;
    let off = tv(&always, &refr[0], draws);
    assert!(
        off > 0.2,
        "the greedy point mass is only {off:.3} from the target"
    );
}
