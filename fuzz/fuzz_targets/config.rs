//! The site config: never a panic; an accepted config's canonical form
//! parses to the same config and prints the same; a refusal is one line
//! naming the file; salvaging any text gives a config that is itself valid
//! (the hooks run on it when the file is broken).
#![no_main]

use gpu_mode_core::config::Config;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

const FILE: &str = "/etc/slurm-gpu-mode/config.toml";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Config::parse(text, Path::new(FILE)) {
        Ok(mut cfg) => {
            let canonical = cfg.canonical();
            let again = Config::parse(&canonical, Path::new(FILE)).unwrap_or_else(|e| panic!("canonical form refused: {e}\n{canonical}"));
            // The canonical form is written in today's sections: no notice.
            assert!(again.notices.is_empty(), "{:?}\n{canonical}", again.notices);
            // The same meaning; the notices are about how the file was written.
            cfg.notices.clear();
            assert_eq!(again, cfg, "{canonical}");
            assert_eq!(again.canonical(), canonical);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("config file {FILE}: ")), "{msg}");
            assert!(!msg.contains('\n'), "{msg:?}");
        }
    }
    let salvaged = Config::salvage(text);
    if let Err(e) = Config::parse(&salvaged.canonical(), Path::new(FILE)) {
        panic!("salvage gave an invalid config: {e}");
    }
});
