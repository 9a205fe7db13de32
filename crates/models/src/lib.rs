//! The models Straddle knows by name: each one's file in the model cache, its SHA-256 and
//! size. `cargo xtask setup` fetches them; the CLI, the cloud server, the demo and the tests
//! find them here, so a file name or a hash is written once.

use std::path::PathBuf;

/// A model `cargo xtask setup` fetches and verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// Short name for command lines and the demo's picker.
    pub id: &'static str,
    /// What a person reads.
    pub title: &'static str,
    /// File name in [`model_dir`].
    pub file: &'static str,
    /// SHA-256 of the whole file, hex.
    pub sha256: &'static str,
    /// Size of the file.
    pub bytes: u64,
    /// The variable that points tests at another copy (`cargo xtask test` sets it).
    pub test_var: &'static str,
}

/// SmolLM2-135M-Instruct Q4_1: the smallest, for tests that need speed.
pub const SMOLLM2: KnownModel = KnownModel {
    id: "smollm2",
    title: "SmolLM2-135M-Instruct Q4_1",
    file: "smollm2-135m-instruct-q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    bytes: 98_362_432,
    test_var: "STRADDLE_TEST_MODEL",
};

/// Gemma 3 270M (base, not instruction-tuned) Q4_K_M: the second architecture.
pub const GEMMA3: KnownModel = KnownModel {
    id: "gemma3",
    title: "Gemma 3 270M base Q4_K_M",
    file: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    bytes: 253_113_024,
    test_var: "STRADDLE_TEST_GEMMA",
};

/// Qwen2.5-Coder-0.5B-Instruct (the GGUF of its AWQ release): the default edge model.
pub const QWEN_EDGE: KnownModel = KnownModel {
    id: "qwen-0.5b",
    title: "Qwen2.5-Coder-0.5B-Instruct",
    file: "qwen2.5-coder-0.5b-instruct.gguf",
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    bytes: 491_400_064,
    test_var: "STRADDLE_TEST_QWEN",
};

/// Qwen2.5-Coder-1.5B-Instruct Q4_K_M: the default cloud model, of the edge's family and
/// vocabulary (so the edge can draft for it).
pub const QWEN_CLOUD: KnownModel = KnownModel {
    id: "qwen-1.5b",
    title: "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    bytes: 1_117_320_768,
    test_var: "STRADDLE_TEST_QWEN_CLOUD",
};

/// Every known model, the default edge model first.
pub const ALL: [KnownModel; 4] = [QWEN_EDGE, QWEN_CLOUD, SMOLLM2, GEMMA3];

/// The models a page may run on the device, the default first: the demo's picker. The cloud
/// model is left out (a gigabyte is too much to download into a tab).
pub const EDGE_CHOICES: [KnownModel; 3] = [QWEN_EDGE, SMOLLM2, GEMMA3];

/// The model the page and `straddle chat` run on the device unless told otherwise.
pub const DEFAULT_EDGE: KnownModel = QWEN_EDGE;

/// The model `straddle-cloud` serves unless told otherwise.
pub const DEFAULT_CLOUD: KnownModel = QWEN_CLOUD;

impl KnownModel {
    /// Where `cargo xtask setup` keeps it.
    pub fn path(&self) -> PathBuf {
        model_dir().join(self.file)
    }

    /// The copy a test should use: the one its variable names, else [`Self::path`].
    pub fn test_path(&self) -> PathBuf {
        std::env::var_os(self.test_var).map_or_else(|| self.path(), PathBuf::from)
    }

    /// What a page needs to offer it, as JSON: `{url, title, sha256, bytes}` with the model
    /// served under `/models/`.
    pub fn page_entry(&self) -> String {
        format!(
            r#"{{"url":"/models/{}","title":"{}","sha256":"{}","bytes":{}}}"#,
            self.file, self.title, self.sha256, self.bytes
        )
    }

    /// The known model with this id, or this file name.
    pub fn find(name: &str) -> Option<KnownModel> {
        ALL.into_iter().find(|m| m.id == name || m.file == name)
    }
}

/// [`EDGE_CHOICES`] as the JSON array the demo's page reads.
pub fn page_catalog() -> String {
    let entries: Vec<String> = EDGE_CHOICES.iter().map(KnownModel::page_entry).collect();
    format!("[{}]", entries.join(","))
}

/// Straddle's cache outside any checkout: `$STRADDLE_CACHE`, else `~/.cache/straddle`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("STRADDLE_CACHE") {
        return PathBuf::from(dir);
    }
    std::env::var_os("HOME")
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
        .join(".cache/straddle")
}

/// Where `cargo xtask setup` puts the models.
pub fn model_dir() -> PathBuf {
    cache_dir().join("models")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_files_and_hashes_are_distinct_and_well_formed() {
        for (i, a) in ALL.iter().enumerate() {
            assert_eq!(a.sha256.len(), 64, "{}", a.id);
            assert!(a.sha256.bytes().all(|b| b.is_ascii_hexdigit()), "{}", a.id);
            assert!(a.file.ends_with(".gguf"), "{}", a.id);
            for b in &ALL[i + 1..] {
                assert!(a.id != b.id && a.file != b.file && a.sha256 != b.sha256);
                assert_ne!(a.test_var, b.test_var);
            }
        }
        assert_eq!(KnownModel::find("qwen-0.5b"), Some(QWEN_EDGE));
        assert_eq!(KnownModel::find(GEMMA3.file), Some(GEMMA3));
        assert_eq!(KnownModel::find("gpt-4"), None);
    }
}
