#![no_main]
// The property checks live in satellite::fuzz, where tests/fuzz_regressions.rs replays them on stable.
libfuzzer_sys::fuzz_target!(|data: &[u8]| satellite::fuzz::sse(data));
