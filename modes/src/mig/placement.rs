//! Where a layout's MIG instances go on one GPU.
//!
//! NVIDIA's rules (the MIG user guide; read back with NVML on an H200): each profile may start only at
//! certain memory slices (4g at 0; 3g at 0 or 4; 2g at 0, 2, 4; 1g anywhere)
//! and covers `placement_size` memory slices; instances must not overlap; a
//! profile allows at most `instance_count` instances; the GPU has a fixed
//! number of compute slices (7). Creating small instances first can block a
//! large one's only placement, and largest-first is not enough either
//! (3g + 2g + 2g fits only with the 3g at slice 4), so the whole layout is
//! placed by a search before anything is created, and every instance is
//! then created *with* its placement.

use crate::gpu::MigProfile;

/// One instance to create: a profile at a start slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub profile_id: u32,
    pub name: String,
    pub start: u32,
    pub size: u32,
}

/// What a GPU already holds that a layout must fit around.
#[derive(Debug, Clone, Default)]
pub struct Occupied {
    /// Memory-slice ranges `[start, start + size)` in use.
    pub ranges: Vec<(u32, u32)>,
    /// Compute slices in use.
    pub compute: u32,
    /// Instances per profile id already there.
    pub per_profile: Vec<(u32, u32)>,
}

/// The GPU's compute slices: those of its largest (whole-GPU) profile.
pub fn compute_slices(table: &[MigProfile]) -> u32 {
    table.iter().map(|p| p.slices).max().unwrap_or(0)
}

/// Places `want` (profile, count) around `occupied`; `None` when no
/// placement of the whole layout exists. Exhaustive: any layout that fits
/// is placed.
pub fn place(want: &[(&MigProfile, u32)], occupied: &Occupied, compute_total: u32) -> Option<Vec<Placed>> {
    let mut items: Vec<&MigProfile> = want.iter().flat_map(|(p, n)| std::iter::repeat_n(*p, *n as usize)).collect();
    let compute: u32 = items.iter().map(|p| p.slices).sum();
    if occupied.compute + compute > compute_total {
        return None;
    }
    for (p, n) in want {
        let there = occupied.per_profile.iter().find(|(id, _)| *id == p.id).map_or(0, |(_, c)| *c);
        if there + n > p.instance_count {
            return None;
        }
    }
    // Most constrained first: big instances, then those with few starts.
    items.sort_by_key(|p| (std::cmp::Reverse(p.placement_size), p.placement_starts.len(), p.id));
    let mut taken = occupied.ranges.clone();
    let mut out = Vec::with_capacity(items.len());
    search(&items, &mut taken, &mut out).then_some(out)
}

fn search(items: &[&MigProfile], taken: &mut Vec<(u32, u32)>, out: &mut Vec<Placed>) -> bool {
    let Some((p, rest)) = items.split_first() else { return true };
    // Identical profiles are interchangeable: place each after the last
    // one of its kind, so the same set is never tried in another order.
    let after = out.iter().rev().find(|x| x.profile_id == p.id).map(|x| x.start);
    for &start in &p.placement_starts {
        if after.is_some_and(|a| start <= a) || overlaps(taken, start, p.placement_size) {
            continue;
        }
        taken.push((start, p.placement_size));
        out.push(Placed { profile_id: p.id, name: p.name.clone(), start, size: p.placement_size });
        if search(rest, taken, out) {
            return true;
        }
        out.pop();
        taken.pop();
    }
    false
}

fn overlaps(taken: &[(u32, u32)], start: u32, size: u32) -> bool {
    taken.iter().any(|&(s, n)| start < s + n && s < start + size)
}

/// A layout close to `want` that fits an empty GPU: instances are dropped,
/// largest first, until the rest fits. `None` when even one instance does
/// not fit (cannot happen with NVIDIA's tables, kept for odd ones).
pub fn suggest(want: &[(&MigProfile, u32)], compute_total: u32) -> Option<Vec<(String, u32)>> {
    let mut counts: Vec<(&MigProfile, u32)> = want.to_vec();
    loop {
        counts.retain(|(_, n)| *n > 0);
        if counts.is_empty() {
            return None;
        }
        if place(&counts, &Occupied::default(), compute_total).is_some() {
            return Some(counts.iter().map(|(p, n)| (p.name.clone(), *n)).collect());
        }
        let largest = counts.iter_mut().max_by_key(|(p, _)| (p.slices, p.placement_size))?;
        largest.1 -= 1;
    }
}

/// The H100 80GB profile table as a real H100 reports it (sim fixture
/// h100-80gb, docs/validation.md): for tests and the benchmark.
pub fn h100_table() -> Vec<MigProfile> {
    let p = |id, name: &str, slices, count, starts: &[u32], size| MigProfile {
        profile: 0,
        id,
        name: name.into(),
        slices,
        instance_count: count,
        memory_mb: 0,
        sms: 0,
        copy_engines: 0,
        placement_starts: starts.to_vec(),
        placement_size: size,
    };
    vec![
        p(19, "1g.10gb", 1, 7, &[0, 1, 2, 3, 4, 5, 6], 1),
        p(20, "1g.10gb+me", 1, 1, &[0, 1, 2, 3, 4, 5, 6], 1),
        p(15, "1g.20gb", 1, 4, &[0, 2, 4, 6], 2),
        p(14, "2g.20gb", 2, 3, &[0, 2, 4], 2),
        p(9, "3g.40gb", 3, 2, &[0, 4], 4),
        p(5, "4g.40gb", 4, 1, &[0], 4),
        p(0, "7g.80gb", 7, 1, &[0], 8),
    ]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn h100() -> Vec<MigProfile> {
        h100_table()
    }

    fn want<'a>(table: &'a [MigProfile], list: &[(&str, u32)]) -> Vec<(&'a MigProfile, u32)> {
        list.iter().map(|(n, c)| (table.iter().find(|p| p.name == *n).unwrap(), *c)).collect()
    }

    /// Checks a placement against the rules independently of the search.
    fn valid(table: &[MigProfile], placed: &[Placed]) -> bool {
        let mut taken = Vec::new();
        for x in placed {
            let p = table.iter().find(|p| p.id == x.profile_id).unwrap();
            if !p.placement_starts.contains(&x.start) || overlaps(&taken, x.start, p.placement_size) {
                return false;
            }
            taken.push((x.start, p.placement_size));
        }
        placed.iter().map(|x| table.iter().find(|p| p.id == x.profile_id).unwrap().slices).sum::<u32>() <= 7
    }

    #[test]
    fn layouts_that_need_more_than_largest_first_are_placed() {
        let t = h100();
        let cases: Vec<Vec<(&str, u32)>> = vec![
            vec![("4g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 1)],
            // Only with the 3g at slice 4: largest-first would put it at 0.
            vec![("3g.40gb", 1), ("2g.20gb", 2)],
            vec![("1g.10gb", 7)],
            vec![("3g.40gb", 2)],
            vec![("7g.80gb", 1)],
            vec![("1g.20gb", 4)],
            vec![("2g.20gb", 3), ("1g.10gb", 1)],
            vec![("1g.10gb+me", 1), ("1g.10gb", 6)],
        ];
        for list in cases {
            let w = want(&t, &list);
            let placed = place(&w, &Occupied::default(), 7).unwrap_or_else(|| panic!("{list:?} must fit"));
            assert!(valid(&t, &placed), "{list:?}: {placed:?}");
            assert_eq!(placed.len() as u32, list.iter().map(|(_, n)| n).sum::<u32>());
        }
    }

    #[test]
    fn every_multiset_that_fits_is_placed_and_no_other() {
        // Brute force over every multiset of up to 7 instances of the H100's
        // profiles: the search finds a placement exactly when an
        // independent exhaustive check (all start assignments) finds one.
        let t = h100();
        let mut counts = vec![0u32; t.len()];
        let mut checked = 0;
        loop {
            let w: Vec<(&MigProfile, u32)> = t.iter().zip(&counts).filter(|(_, n)| **n > 0).map(|(p, n)| (p, *n)).collect();
            let got = place(&w, &Occupied::default(), 7);
            assert_eq!(got.is_some(), brute_force_fits(&w), "{:?}", w.iter().map(|(p, n)| (&p.name, n)).collect::<Vec<_>>());
            if let Some(placed) = got {
                assert!(valid(&t, &placed));
            }
            checked += 1;
            if !next(&mut counts, 7) {
                break;
            }
        }
        assert!(checked > 1000, "{checked}");
    }

    /// Next multiset (counts per profile) with at most `max` instances.
    fn next(counts: &mut [u32], max: u32) -> bool {
        for i in 0..counts.len() {
            counts[i] += 1;
            if counts.iter().sum::<u32>() <= max {
                return true;
            }
            counts[i] = 0;
        }
        false
    }

    fn brute_force_fits(w: &[(&MigProfile, u32)]) -> bool {
        let items: Vec<&MigProfile> = w.iter().flat_map(|(p, n)| std::iter::repeat_n(*p, *n as usize)).collect();
        if items.iter().map(|p| p.slices).sum::<u32>() > 7 || w.iter().any(|(p, n)| *n > p.instance_count) {
            return false;
        }
        fn go(items: &[&MigProfile], taken: &mut Vec<(u32, u32)>) -> bool {
            let Some((p, rest)) = items.split_first() else { return true };
            p.placement_starts.iter().any(|&s| {
                if overlaps(taken, s, p.placement_size) {
                    return false;
                }
                taken.push((s, p.placement_size));
                let ok = go(rest, taken);
                taken.pop();
                ok
            })
        }
        go(&items, &mut Vec::new())
    }

    #[test]
    fn layouts_that_do_not_fit_are_refused_with_a_suggestion() {
        let t = h100();
        type Layout<'a> = Vec<(&'a str, u32)>;
        let cases: Vec<(Layout, Layout)> = vec![
            (vec![("3g.40gb", 3)], vec![("3g.40gb", 2)]),
            (vec![("4g.40gb", 1), ("3g.40gb", 1), ("1g.10gb", 1)], vec![("3g.40gb", 1), ("1g.10gb", 1)]),
            (vec![("7g.80gb", 1), ("1g.10gb", 1)], vec![("1g.10gb", 1)]),
            (vec![("1g.10gb+me", 2)], vec![("1g.10gb+me", 1)]),
            (vec![("2g.20gb", 4)], vec![("2g.20gb", 3)]),
        ];
        for (list, suggestion) in cases {
            let w = want(&t, &list);
            assert!(place(&w, &Occupied::default(), 7).is_none(), "{list:?} must not fit");
            let got = suggest(&w, 7).unwrap();
            let want_s: Vec<(String, u32)> = suggestion.iter().map(|(n, c)| (n.to_string(), *c)).collect();
            assert_eq!(got, want_s, "{list:?}");
        }
    }

    #[test]
    fn a_layout_fits_around_what_a_gpu_already_holds() {
        let t = h100();
        // A 3g at slice 0 is there (e.g. the node's baseline or another job).
        let occupied = Occupied { ranges: vec![(0, 4)], compute: 3, per_profile: vec![(9, 1)] };
        let placed = place(&want(&t, &[("3g.40gb", 1)]), &occupied, 7).unwrap();
        assert_eq!(placed[0].start, 4);
        assert!(place(&want(&t, &[("4g.40gb", 1)]), &occupied, 7).is_none());
        assert!(place(&want(&t, &[("3g.40gb", 2)]), &occupied, 7).is_none(), "instance_count 2 with one there");
    }
}
