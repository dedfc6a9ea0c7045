//! Checkpoint manifests (what a restore trusts): never a panic; an
//! accepted manifest's own text parses back to it; a refusal names the file.
#![no_main]

use gpu_mode_core::preempt::Manifest;
use libfuzzer_sys::fuzz_target;

const FILE: &str = "/var/lib/slurm-gpu-mode/images/7/0/manifest.json";

fuzz_target!(|data: &[u8]| {
    match Manifest::parse(data, FILE) {
        Ok(m) => {
            let text = serde_json::to_vec(&m).expect("a manifest serializes");
            let again = Manifest::parse(&text, FILE).unwrap_or_else(|e| panic!("own text refused: {e}"));
            assert_eq!(again, m);
            // The owner check never panics, whatever the numbers.
            let _ = m.check_owner(std::path::Path::new("/x"), m.job.wrapping_add(1), m.uid);
        }
        Err(e) => assert!(e.to_string().contains(FILE), "{e}"),
    }
});
