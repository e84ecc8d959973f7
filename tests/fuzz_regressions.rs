//! Replays every kept fuzz input through its target on the stable toolchain: the seed corpus
//! (`fuzz/seeds/<target>/`) and every input the fuzzer ever found a failure with (`fuzz/regressions/<target>/`,
//! where `scripts/fuzz.sh` copies them). The targets themselves are `satellite::fuzz`; a panic is a failure.

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

#[test]
fn every_kept_fuzz_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut failures = Vec::new();
    for (name, target) in satellite::fuzz::TARGETS {
        let seeds = inputs(&root.join("seeds").join(name));
        assert!(!seeds.is_empty(), "fuzz target {name} has no seed inputs in fuzz/seeds/{name}");
        for path in seeds.iter().chain(inputs(&root.join("regressions").join(name)).iter()) {
            let data = std::fs::read(path).expect("fuzz input is readable");
            if std::panic::catch_unwind(|| target(&data)).is_err() {
                failures.push(format!("{name}: {}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "fuzz inputs that fail their target:\n{}", failures.join("\n"));
}

/// The cargo-fuzz binaries and the replayed list are the same targets: each `fuzz/fuzz_targets/<name>.rs` calls
/// `satellite::fuzz::<name>`, and every binary is in the list.
#[test]
fn the_fuzz_binaries_are_the_replayed_targets() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/fuzz_targets");
    let binaries: Vec<String> =
        inputs(&dir).iter().filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned())).collect();
    let listed: Vec<String> = satellite::fuzz::TARGETS.iter().map(|(name, _)| (*name).to_owned()).collect();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(binaries, sorted, "fuzz/fuzz_targets and satellite::fuzz::TARGETS differ");
    for name in &listed {
        let text = std::fs::read_to_string(dir.join(format!("{name}.rs"))).expect("target source is readable");
        assert!(
            text.contains(&format!("satellite::fuzz::{name}(")),
            "fuzz/fuzz_targets/{name}.rs does not call its target"
        );
    }
}
