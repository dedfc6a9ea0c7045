//! Properties of the `--gpu-mode` grammar over generated input (audit item
//! M2 and the hardening issue's round-trip rule): parsing never panics; every
//! accepted value prints in canonical form and parses back to itself; every
//! rejection names the offending part; memory sizes never overflow into range.

use gpu_mode_core::gpu_mode::{CheckpointParams, GpuMode, MemLimit, MemUnit, MigProfileCount, MigRequest, MpsParams, NcclTransport};
use proptest::prelude::*;

fn profile() -> impl Strategy<Value = String> {
    (prop::sample::select(vec![1u8, 2, 3, 4, 7]), 1u32..=200, prop::sample::select(vec!["", "+me", "-me", "+gfx"]))
        .prop_map(|(s, m, suffix)| format!("{s}g.{m}gb{suffix}"))
}

/// Valid modes, built as values.
fn mode() -> impl Strategy<Value = GpuMode> {
    let mem = (1u64..=1024, any::<bool>()).prop_map(|(n, g)| MemLimit { amount: n, unit: if g { MemUnit::GiB } else { MemUnit::MiB } });
    let mps = (prop::option::of(1u8..=100), prop::option::of(mem)).prop_map(|(threads, mem)| GpuMode::Mps(MpsParams { threads, mem }));
    // Each profile at most once: a repeat must be written with a count.
    let list = prop::collection::btree_map(profile(), 1u8..=7, 1..4).prop_map(|v| {
        GpuMode::Mig(MigRequest::Profiles(
            v.into_iter().map(|(p, count)| MigProfileCount { profile: p.parse().unwrap(), count }).collect(),
        ))
    });
    let layout = "[a-zA-Z0-9_-]{1,32}".prop_map(|n| GpuMode::Mig(MigRequest::Layout(n)));
    let nccl = prop::option::of(prop_oneof![Just(NcclTransport::Portable), Just(NcclTransport::Native)]);
    let checkpoint = (nccl, prop::option::of(any::<bool>()))
        .prop_map(|(nccl, pool)| GpuMode::Checkpoint(CheckpointParams { nccl, pool }));
    prop_oneof![mps, list, layout, checkpoint]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn valid_modes_round_trip_through_their_canonical_form(m in mode()) {
        let text = m.to_string();
        prop_assert_eq!(GpuMode::parse(&text), Ok(m), "{}", text);
    }

    #[test]
    fn any_input_parses_or_is_refused_and_accepted_input_is_canonical_after_one_print(s in "\\PC{0,40}|(mps|mig|checkpoint)[:=,@x.0-9a-zA-Z+-]{0,40}") {
        if let Ok(m) = GpuMode::parse(&s) {
            let canonical = m.to_string();
            prop_assert_eq!(GpuMode::parse(&canonical), Ok(m.clone()));
            prop_assert_eq!(GpuMode::parse(&canonical).unwrap().to_string(), canonical);
        }
    }

    #[test]
    fn memory_limits_never_wrap_into_range(n in any::<u64>(), g in any::<bool>()) {
        let value = format!("mps:mem={n}{}", if g { 'G' } else { 'M' });
        let mib = if g { n.checked_mul(1024) } else { Some(n) };
        let fits = matches!(mib, Some(m) if (1..=1024 * 1024).contains(&m));
        match GpuMode::parse(&value) {
            Ok(GpuMode::Mps(p)) => {
                prop_assert!(fits, "{} was accepted", value);
                prop_assert_eq!(p.mem.unwrap().mebibytes(), mib);
            }
            Ok(other) => prop_assert!(false, "{} parsed as {:?}", value, other),
            Err(e) => {
                prop_assert!(!fits, "{} was refused: {}", value, e);
                prop_assert!(e.problem.contains(&format!("mem={n}")), "the problem names the part: {}", e.problem);
            }
        }
    }

    #[test]
    fn a_rejected_mps_threads_value_is_named(t in any::<u32>()) {
        let value = format!("mps:threads={t}");
        match GpuMode::parse(&value) {
            Ok(_) => prop_assert!((1..=100).contains(&t)),
            Err(e) => {
                prop_assert!(!(1..=100).contains(&t));
                prop_assert!(e.problem.contains(&format!("threads={t}")), "{}", e.problem);
            }
        }
    }
}
