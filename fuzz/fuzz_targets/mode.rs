//! `--gpu-mode` values: never a panic; an accepted value prints in
//! canonical form, which parses to the same mode and prints the same; a
//! refusal is one line (no control characters: it reaches log lines and
//! terminals) that quotes the value bounded.
#![no_main]

use gpu_mode_core::gpu_mode::GpuMode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = std::str::from_utf8(data) else { return };
    match GpuMode::parse(value) {
        Ok(mode) => {
            let canonical = mode.to_string();
            let again = GpuMode::parse(&canonical).unwrap_or_else(|e| panic!("{value:?} → {canonical:?} is refused: {e}"));
            assert_eq!(again, mode, "{value:?} → {canonical:?}");
            assert_eq!(again.to_string(), canonical);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("invalid --gpu-mode value \""), "{msg}");
            assert!(!msg.chars().any(char::is_control), "{msg:?}");
            assert!(!e.problem.is_empty());
            assert!(msg.len() < 2048, "{} bytes", msg.len());
        }
    }
});
