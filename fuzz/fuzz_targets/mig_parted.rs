//! mig-parted configs (root reads them at boot): never a panic, a hang or
//! unbounded memory (aliases, nesting); every config of an accepted file
//! writes in canonical form that reads back to the same entries; every
//! refusal is one line naming the file.
#![no_main]

use gpu_mode_core::mig_baseline::parted;
use libfuzzer_sys::fuzz_target;

const FILE: &str = "/etc/slurm-gpu-mode/mig-parted.yaml";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let names = match parted::config_names(text, FILE) {
        Ok(names) => names,
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with(&format!("mig-parted config {FILE}: ")) && !e.contains('\n'), "{e:?}");
            return;
        }
    };
    for name in names {
        match parted::parse(text, FILE, &name) {
            Ok(b) => {
                let canonical = parted::write(&name, &b);
                let again = parted::parse(&canonical, FILE, &name).unwrap_or_else(|e| panic!("canonical form refused: {e}\n{canonical}"));
                assert_eq!(again, b, "{canonical}");
            }
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(FILE) && !e.contains('\n'), "{e:?}")
            }
        }
    }
});
