//! Slurm hostlist expressions, as gres.conf uses them for `NodeName=` and
//! `File=`: `a,b`, `node[01-04,7]`, `rack[1-2]-n[01-02]`, `/dev/nvidia[0-3]`.
//!
//! Rules follow Slurm's hostlist.c: a range keeps the width of its lower
//! bound (`[08-10]` → 08 09 10, `[8-10]` → 8 9 10), negative numbers and
//! reversed ranges are refused, and one expression expands to at most
//! [`MAX_NAMES`] names (Slurm's MAX_RANGE), so a typo cannot eat memory.

/// Most names one expression may expand to (Slurm's MAX_RANGE, 64 Ki).
pub const MAX_NAMES: usize = 64 * 1024;

/// Expands `expr` into its names, in order.
pub fn expand(expr: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in split_top_level(expr)? {
        if item.is_empty() {
            return Err(format!("empty name in {expr:?}"));
        }
        let names = expand_item(item).map_err(|e| format!("{e} in {expr:?}"))?;
        out.extend(names);
        if out.len() > MAX_NAMES {
            return Err(format!("{expr:?} names more than {MAX_NAMES} hosts"));
        }
    }
    Ok(out)
}

/// Splits at commas outside brackets; checks the brackets pair up.
fn split_top_level(expr: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in expr.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("nested '[' in {expr:?}")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("']' without '[' in {expr:?}")),
            ',' if depth == 0 => {
                items.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("'[' without ']' in {expr:?}"));
    }
    items.push(&expr[start..]);
    Ok(items)
}

/// One item without top-level commas: literal text and bracket groups,
/// expanded as their cartesian product (leftmost group varies slowest).
fn expand_item(item: &str) -> Result<Vec<String>, String> {
    let mut names = vec![String::new()];
    let mut rest = item;
    while !rest.is_empty() {
        let (literal, group, after) = match rest.find('[') {
            Some(open) => {
                let close = open + rest[open..].find(']').ok_or_else(|| "'[' without ']'".to_string())?;
                (&rest[..open], Some(&rest[open + 1..close]), &rest[close + 1..])
            }
            None => (rest, None, ""),
        };
        names.iter_mut().for_each(|n| n.push_str(literal));
        if let Some(group) = group {
            let numbers = expand_ranges(group)?;
            if names.len().saturating_mul(numbers.len()) > MAX_NAMES {
                return Err(format!("more than {MAX_NAMES} names"));
            }
            names = names.iter().flat_map(|n| numbers.iter().map(move |num| format!("{n}{num}"))).collect();
        }
        rest = after;
    }
    Ok(names)
}

/// `01-04,7` → `01 02 03 04 7`.
fn expand_ranges(group: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for range in group.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let number = |s: &str| -> Result<u64, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 18 {
                return Err(format!("bad range [{group}]: {range:?} is not N or N-M"));
            }
            s.parse().map_err(|_| format!("bad range [{group}]"))
        };
        let (l, h) = (number(lo)?, number(hi)?);
        if l > h {
            return Err(format!("bad range [{group}]: {range} runs backwards"));
        }
        if h - l >= MAX_NAMES as u64 || out.len() + (h - l) as usize >= MAX_NAMES {
            return Err(format!("range [{group}] names more than {MAX_NAMES} hosts"));
        }
        let width = lo.len();
        out.extend((l..=h).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_expand_like_slurm() {
        let cases: &[(&str, &[&str])] = &[
            ("gpu07", &["gpu07"]),
            ("a,b", &["a", "b"]),
            ("node[01-04,7]", &["node01", "node02", "node03", "node04", "node7"]),
            ("n[8-10]", &["n8", "n9", "n10"]),
            ("n[08-10]", &["n08", "n09", "n10"]),
            ("r[1-2]-n[01-02]", &["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
            ("x[1]y,z", &["x1y", "z"]),
            ("/dev/nvidia[0-3]", &["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]),
            ("/dev/nvidia2,/dev/nvidia0", &["/dev/nvidia2", "/dev/nvidia0"]),
            ("/dev/nvidia[3,1]", &["/dev/nvidia3", "/dev/nvidia1"]),
        ];
        for (expr, want) in cases {
            assert_eq!(expand(expr).unwrap(), *want, "{expr}");
        }
    }

    #[test]
    fn bad_expressions_name_the_problem() {
        let cases = [
            ("n[1-2", "'[' without ']'"),
            ("n1-2]", "']' without '['"),
            ("n[[1]]", "nested '['"),
            ("n[2-1]", "runs backwards"),
            ("n[a-b]", "is not N or N-M"),
            ("n[-1]", "is not N or N-M"),
            ("n[]", "is not N or N-M"),
            ("n[1--2]", "is not N or N-M"),
            ("a,,b", "empty name"),
            ("n[0-99999]", "more than 65536"),
            ("a[0-999]b[0-999]", "more than 65536"),
        ];
        for (expr, needle) in cases {
            let err = expand(expr).expect_err(expr);
            assert!(err.contains(needle), "{expr}: {err}");
        }
    }
}
