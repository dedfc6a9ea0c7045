//! Job state files (version 2, and version 1 converted): never a panic;
//! an accepted file is job 7's, and its own text parses back to it; a
//! refusal names the file.
#![no_main]

use gpu_mode_core::state::JobState;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

const FILE: &str = "/run/slurm-gpu-mode/jobs/7.json";

fuzz_target!(|data: &[u8]| {
    match JobState::parse(data, Path::new(FILE), 7) {
        Ok(state) => {
            assert_eq!(state.job_id, 7);
            let text = serde_json::to_vec_pretty(&state).expect("a state serializes");
            let again = JobState::parse(&text, Path::new(FILE), 7).unwrap_or_else(|e| panic!("own text refused: {e}"));
            assert_eq!(again, state);
        }
        Err(e) => assert!(e.to_string().contains(FILE), "{e}"),
    }
});
