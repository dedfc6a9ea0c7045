//! A job's `mig:` request as profiles of one GPU model: names resolved
//! against the GPU's own profile table, counts checked, and a placement found,
//! or a job refusal that names the problem and suggests a layout that fits.

use super::placement::{compute_slices, place, suggest, Occupied, Placed};
use crate::config::Config;
use crate::gpu::MigProfile;
use crate::gpu_mode::{GpuMode, MigProfileCount, MigRequest};

/// Why a job's `mig:` request cannot be laid out on a GPU: the job is
/// refused with it (the node is fine).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("MIG layout \"{0}\" is not defined on this node")]
    UndefinedLayout(String),
    #[error("MIG layout \"{name}\" = \"{text}\" is not a profile list")]
    NotAProfileList { name: String, text: String },
    #[error("{model} has no MIG profiles (not a MIG-capable GPU)")]
    NotMigCapable { model: String },
    /// `known`: the GPU's profile names, comma-separated.
    #[error("{model} has no MIG profile {profile}; its profiles are {known}")]
    UnknownProfile { model: String, profile: String, known: String },
    /// `asked` in the option's syntax; `why` the first reason found;
    /// `hint` a layout that fits, or empty.
    #[error("MIG layout {asked} does not fit: {why}{hint}")]
    DoesNotFit { asked: String, why: String, hint: String },
    /// With `[gpu] mig_instances = "leave"`.
    #[error("{wanted} free {profile} instance(s) wanted, {free} there, and [gpu] mig_instances = \"leave\" (an admin must create them)")]
    TooFewFree { wanted: u32, profile: String, free: usize },
    #[error("MIG instance {0} has no compute instance")]
    NoComputeInstance(u32),
}

/// The profiles and counts a request asks for, `@name` resolved from the
/// site config (`[mig.layouts]`).
pub fn requested(cfg: &Config, request: &MigRequest) -> Result<Vec<MigProfileCount>, LayoutError> {
    match request {
        MigRequest::Profiles(list) => Ok(list.clone()),
        MigRequest::Layout(name) => {
            let text = cfg.mig.layouts.get(name).ok_or_else(|| LayoutError::UndefinedLayout(name.clone()))?;
            match GpuMode::parse(&format!("mig:{text}")) {
                Ok(GpuMode::Mig(MigRequest::Profiles(list))) => Ok(list),
                // The config is validated on load; this guards a stale file.
                _ => Err(LayoutError::NotAProfileList { name: name.clone(), text: text.clone() }),
            }
        }
    }
}

/// `list` as this GPU's profiles. A name the GPU lacks is refused with the
/// names it has (an H100's `1g.10gb` is an H200's `1g.18gb`).
pub fn resolve<'a>(list: &[MigProfileCount], table: &'a [MigProfile], model: &str) -> Result<Vec<(&'a MigProfile, u32)>, LayoutError> {
    if table.is_empty() {
        return Err(LayoutError::NotMigCapable { model: model.into() });
    }
    list.iter()
        .map(|pc| {
            let name = pc.profile.to_string();
            let p = table.iter().find(|p| p.name == name).ok_or_else(|| {
                let names: Vec<&str> = table.iter().map(|p| p.name.as_str()).collect();
                LayoutError::UnknownProfile { model: model.into(), profile: name.clone(), known: names.join(", ") }
            })?;
            Ok((p, u32::from(pc.count)))
        })
        .collect()
}

/// Places `want` on a GPU of `model` around `occupied`, or explains why not
/// with a layout that would fit.
pub fn place_or_explain(want: &[(&MigProfile, u32)], table: &[MigProfile], occupied: &Occupied, model: &str) -> Result<Vec<Placed>, LayoutError> {
    let total = compute_slices(table);
    if let Some(placed) = place(want, occupied, total) {
        return Ok(placed);
    }
    let asked = show(want.iter().map(|(p, n)| (p.name.clone(), *n)));
    let slices: u32 = want.iter().map(|(p, n)| p.slices * n).sum();
    let why = if slices > total {
        format!("it needs {slices} compute slices and a {model} has {total}")
    } else if let Some((p, n)) = want.iter().find(|(p, n)| *n > p.instance_count) {
        format!("a {model} allows at most {} {} instance(s), not {n}", p.instance_count, p.name)
    } else if occupied.ranges.is_empty() {
        format!("NVIDIA's placement rules leave no room for all of it on a {model}")
    } else {
        format!("it does not fit around the {} MIG instance(s) already on the GPU", occupied.ranges.len())
    };
    let hint = match suggest(want, total) {
        Some(fits) if occupied.ranges.is_empty() => format!("; this fits a {model}: mig:{}", show(fits.into_iter())),
        _ => String::new(),
    };
    Err(LayoutError::DoesNotFit { asked, why, hint })
}

/// `1g.10gbx2,3g.40gb`: the option's own syntax.
fn show(items: impl Iterator<Item = (String, u32)>) -> String {
    items.map(|(n, c)| if c == 1 { n } else { format!("{n}x{c}") }).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::placement::tests::h100;

    fn parse(v: &str) -> Vec<MigProfileCount> {
        match GpuMode::parse(v).unwrap() {
            GpuMode::Mig(MigRequest::Profiles(l)) => l,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_resolve_or_are_refused_by_name() {
        let t = h100();
        let model = "NVIDIA H100 80GB HBM3";
        let cases: Vec<(&str, Result<usize, &str>)> = vec![
            ("mig:1g.10gbx7", Ok(7)),
            ("mig:4g.40gb,2g.20gb,1g.10gb", Ok(3)),
            ("mig:3g.40gbx2", Ok(2)),
            ("mig:1g.18gb", Err("NVIDIA H100 80GB HBM3 has no MIG profile 1g.18gb; its profiles are 1g.10gb, 1g.10gb+me")),
            ("mig:3g.40gbx3", Err("MIG layout 3g.40gbx3 does not fit: it needs 9 compute slices and a NVIDIA H100 80GB HBM3 has 7; this fits a NVIDIA H100 80GB HBM3: mig:3g.40gbx2")),
            ("mig:2g.20gbx3,1g.20gbx1", Ok(4)),
            ("mig:1g.10gb+mex2", Err("allows at most 1 1g.10gb+me instance(s), not 2; this fits a NVIDIA H100 80GB HBM3: mig:1g.10gb+me")),
            ("mig:4g.40gb,3g.40gb", Ok(2)),
        ];
        for (value, want) in cases {
            let got = resolve(&parse(value), &t, model)
                .and_then(|w| place_or_explain(&w, &t, &Occupied::default(), model).map(|p| p.len()));
            match (got, want) {
                (Ok(n), Ok(m)) => assert_eq!(n, m, "{value}"),
                (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{value}: {e}"),
                (got, want) => panic!("{value}: got {got:?}, want {want:?}"),
            }
        }
        let err = resolve(&parse("mig:1g.10gb"), &[], "NVIDIA T4").unwrap_err();
        assert_eq!(err, LayoutError::NotMigCapable { model: "NVIDIA T4".into() });
        assert_eq!(err.to_string(), "NVIDIA T4 has no MIG profiles (not a MIG-capable GPU)");
        let err = resolve(&parse("mig:1g.18gb"), &t, model).unwrap_err();
        assert!(matches!(&err, LayoutError::UnknownProfile { profile, .. } if profile == "1g.18gb"), "{err:?}");
        let err = resolve(&parse("mig:3g.40gbx3"), &t, model).and_then(|w| place_or_explain(&w, &t, &Occupied::default(), model)).unwrap_err();
        assert!(matches!(&err, LayoutError::DoesNotFit { asked, hint, .. } if asked == "3g.40gbx3" && hint == "; this fits a NVIDIA H100 80GB HBM3: mig:3g.40gbx2"), "{err:?}");
    }

    #[test]
    fn named_layouts_come_from_the_site_config() {
        let mut cfg = Config::default();
        cfg.mig.layouts.insert("half".into(), "3g.40gbx2".into());
        let got = requested(&cfg, &MigRequest::Layout("half".into())).unwrap();
        assert_eq!(got, parse("mig:3g.40gbx2"));
        let err = requested(&cfg, &MigRequest::Layout("nope".into())).unwrap_err();
        assert_eq!(err, LayoutError::UndefinedLayout("nope".into()));
        assert_eq!(err.to_string(), "MIG layout \"nope\" is not defined on this node");
        cfg.mig.layouts.insert("stale".into(), "@half".into());
        let err = requested(&cfg, &MigRequest::Layout("stale".into())).unwrap_err();
        assert_eq!(err.to_string(), "MIG layout \"stale\" = \"@half\" is not a profile list");
        let leave = LayoutError::TooFewFree { wanted: 2, profile: "1g.10gb".into(), free: 1 };
        assert_eq!(leave.to_string(), "2 free 1g.10gb instance(s) wanted, 1 there, and [gpu] mig_instances = \"leave\" (an admin must create them)");
        assert_eq!(LayoutError::NoComputeInstance(3).to_string(), "MIG instance 3 has no compute instance");
    }
}
