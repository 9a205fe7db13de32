//! Decision latency for 2 KB prompts (English and Chinese), every signal on: prints a
//! Markdown table of p50 / p99 per stage. `cargo xtask bench router` runs it.

use std::time::Instant;

use straddle_router::pii::tagger as pii_tagger;
use straddle_router::policy::{self, Context, Policy};
use straddle_router::{pii, task};

/// A named piece of the decision, timed on its own.
type Stage<'a> = (&'static str, Box<dyn Fn() + 'a>);

fn prompt(unit: &str) -> String {
    let mut s = String::new();
    while s.len() < 2048 {
        s.push_str(unit);
    }
    s
}

fn percentiles(mut ns: Vec<u128>) -> (f64, f64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    (at(0.5), at(0.99))
}

fn time(iterations: usize, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..iterations / 10 {
        f();
    }
    let ns = (0..iterations)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos()
        })
        .collect();
    percentiles(ns)
}

fn main() {
    let iterations: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let ctx = Context {
        online: true,
        edge_available: true,
        edge_tokens_per_s: 20.0,
        rtt_ms: 80.0,
        edge_languages: vec!["en".into()],
        ..Context::default()
    };
    let policy = Policy::default();
    let prompts = [
        (
            "en",
            prompt(
                "Please summarise the meeting notes below and list the action items. Contact \
                 jane.doe@example.com or call +1 415 555 0199 if anything is unclear; the budget \
                 review moves to 12 March and the vendor quote was $12,400. ",
            ),
        ),
        (
            "zh",
            prompt(
                "请总结下面的会议记录并列出待办事项。如有疑问请联系张经理，电话 13812345678，\
                 邮箱 zhang@example.cn；预算评审改到三月十二日，供应商报价一万二千四百元。",
            ),
        ),
    ];
    let Ok(tagger) = pii_tagger::bundled() else {
        eprintln!("the bundled PII tagger does not load: run the router's tests");
        std::process::exit(1);
    };
    println!("| prompt | stage | p50 µs | p99 µs |");
    println!("|---|---|---:|---:|");
    for (lang, text) in &prompts {
        let stages: [Stage; 4] = [
            (
                "pii::detect",
                Box::new(|| {
                    std::hint::black_box(pii::detect(text));
                }),
            ),
            (
                "of which the name tagger",
                Box::new(|| {
                    std::hint::black_box(tagger.tag(text));
                }),
            ),
            (
                "task::classify",
                Box::new(|| {
                    std::hint::black_box(task::classify(text));
                }),
            ),
            (
                "policy::decide (all signals)",
                Box::new(|| {
                    std::hint::black_box(policy::decide(text, None, &ctx, &policy));
                }),
            ),
        ];
        for (name, f) in &stages {
            let (p50, p99) = time(iterations, f);
            println!("| {lang} {} B | {name} | {p50:.1} | {p99:.1} |", text.len());
        }
    }
}
