//! `cargo xtask bench worker` and `bench budget`: the edge worker beside LiteLLM's proxy,
//! and the tenant budget's refusals and overshoot.

use super::{node_bench, write_section};
use crate::setup;

/// LiteLLM's proxy, the worker's peer, in a venv of its own in the cache (installed once).
fn litellm() -> anyhow::Result<std::path::PathBuf> {
    let bin = setup::python_venv("litellm-venv", &["litellm[proxy]==1.108.7"])?;
    Ok(bin.join("litellm"))
}

/// How to read the worker's rows (kept with the table when it is rewritten).
const READING: &str = "Per request the worker verifies the tenant token, reads the tenant's record, \
re-checks privacy, holds the worst case in the tenant's Durable Object, forwards, counts the \
stream and settles the hold with a cost record (three calls to the object); LiteLLM here checks \
its master key and records no spend (its budgets need a Postgres database). At 64 streams both \
are bound by the two cores they share with the load generator and the upstream.";

/// The tenant budget's false refusals and overshoot, worst-case holds beside growing holds,
/// the worker under local workerd in front of the real cloud server.
pub(super) fn budget() -> anyhow::Result<()> {
    let tools = crate::setup::run()?;
    let cloud = crate::test::worker_and_cloud_built(&tools)?;
    let table = node_bench(
        "worker",
        "bench/budget.mjs",
        &[
            "--cloud".as_ref(),
            cloud.as_os_str(),
            "--model".as_ref(),
            tools.model.as_os_str(),
        ],
    )?;
    print!("{table}");
    write_section(
        "Worker: budget refusals and overshoot",
        &format!(
            "Command: `cargo xtask bench budget` (the worker's build under local workerd \
             through Miniflare, in front of `straddle-cloud` with the default model on \
             127.0.0.1; one tenant per row; all on the same 2 cores)\n\n{table}"
        ),
    )
}

/// What the worker adds to a streamed request, beside LiteLLM's proxy, same upstream, same run.
pub(super) fn worker() -> anyhow::Result<()> {
    let tools = crate::setup::run()?;
    crate::build::worker(&tools)?;
    let litellm = litellm()?;
    let table = node_bench(
        "worker",
        "bench/proxy-latency.mjs",
        &["--litellm".as_ref(), litellm.as_os_str()],
    )?;
    print!("{table}");
    write_section(
        "Worker: latency added over the upstream, beside LiteLLM",
        &format!(
            "Command: `cargo xtask bench worker` (the worker's build under local workerd through \
             Miniflare; LiteLLM 1.108.7's proxy from PyPI, one process, master key, no database; all on the same 2 cores \
             as the load generator and the upstream)\n\n{table}\n{READING}"
        ),
    )
}
