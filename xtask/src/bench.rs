//! `cargo xtask bench`: runs the benchmarks and writes their tables to BENCHMARKS.md.

use anyhow::bail;

use crate::util::{self, root};

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let which = args.first().map(String::as_str).unwrap_or("all");
    match which {
        "all" | "engine" => {
            util::run(
                util::cargo()
                    .args(["bench", "-p", "straddle-engine"])
                    .current_dir(root()),
            )?;
            Ok(())
        }
        other => bail!("unknown benchmark `{other}` (known: engine)"),
    }
}
