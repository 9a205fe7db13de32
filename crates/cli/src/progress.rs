//! Progress bars for long CLI work, in one style: what is counted, the bar, the count, the
//! time so far and an ETA. indicatif draws nothing when stderr is not a terminal.

/// A bar of `len` steps labelled `what`.
pub fn bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    let template = format!("{what} {{bar:40}} {{pos}}/{{len}} [{{elapsed_precise}}, ETA {{eta}}]");
    let style = indicatif::ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
