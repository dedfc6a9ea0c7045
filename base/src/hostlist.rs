//! Slurm hostlist expressions, as gres.conf uses them for `NodeName=` and
//! `File=`: `a,b`, `node[01-04,7]`, `rack[1-2]-n[01-02]`, `/dev/nvidia[0-3]`.
//!
//! Rules follow Slurm's hostlist.c: a range keeps the width of its lower
//! bound (`[08-10]` → 08 09 10, `[8-10]` → 8 9 10), negative numbers and
//! reversed ranges are refused, and one expression expands to at most
//! [`MAX_NAMES`] names (Slurm's MAX_RANGE), so a typo cannot eat memory.

/// Most names one expression may expand to (Slurm's MAX_RANGE, 64 Ki).
pub const MAX_NAMES: usize = 64 * 1024;

/// Why an expression does not expand: its brackets, an empty name, one
/// item's problem, or too many names. gres.conf's reader puts it after
/// `File=: ` or `NodeName=: `, the wrapper says it when the job's excluded
/// nodes cannot be read; each Display names the whole expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("nested '[' in {expr:?}")]
    Nested { expr: String },
    #[error("']' without '[' in {expr:?}")]
    Unopened { expr: String },
    #[error("'[' without ']' in {expr:?}")]
    Unclosed { expr: String },
    /// Two commas in a row, or one at either end.
    #[error("empty name in {expr:?}")]
    EmptyName { expr: String },
    /// One item (between top-level commas) is wrong: `problem` says how.
    #[error("{problem} in {expr:?}")]
    Item { expr: String, problem: ItemError },
    /// The items together name more than [`MAX_NAMES`].
    #[error("{expr:?} names more than {limit} hosts", limit = MAX_NAMES)]
    TooMany { expr: String },
}

/// What is wrong with one item of an expression (`group`: a bracket's
/// inside, `range`: one of its comma-separated ranges).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ItemError {
    /// Caught by the expression's bracket check first; kept for an item alone.
    #[error("'[' without ']'")]
    Unclosed,
    /// Its groups' product is more than [`MAX_NAMES`].
    #[error("more than {limit} names", limit = MAX_NAMES)]
    TooMany,
    /// Empty, not digits, a sign, or more than 18 digits.
    #[error("bad range [{group}]: {range:?} is not N or N-M")]
    NotARange { group: String, range: String },
    /// Digits that still do not parse (not reached with 18 digits at most).
    #[error("bad range [{group}]")]
    Unparsable { group: String },
    #[error("bad range [{group}]: {range} runs backwards")]
    Backwards { group: String, range: String },
    /// One group names more than [`MAX_NAMES`].
    #[error("range [{group}] names more than {limit} hosts", limit = MAX_NAMES)]
    RangeTooLarge { group: String },
}

/// Expands `expr` into its names, in order.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for item in split_top_level(expr)? {
        if item.is_empty() {
            return Err(HostlistError::EmptyName { expr: expr.to_string() });
        }
        let names = expand_item(item).map_err(|problem| HostlistError::Item { expr: expr.to_string(), problem })?;
        out.extend(names);
        if out.len() > MAX_NAMES {
            return Err(HostlistError::TooMany { expr: expr.to_string() });
        }
    }
    Ok(out)
}

/// Splits at commas outside brackets; checks the brackets pair up.
fn split_top_level(expr: &str) -> Result<Vec<&str>, HostlistError> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in expr.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(HostlistError::Nested { expr: expr.to_string() }),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(HostlistError::Unopened { expr: expr.to_string() }),
            ',' if depth == 0 => {
                items.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(HostlistError::Unclosed { expr: expr.to_string() });
    }
    items.push(&expr[start..]);
    Ok(items)
}

/// One item without top-level commas: literal text and bracket groups,
/// expanded as their cartesian product (leftmost group varies slowest).
fn expand_item(item: &str) -> Result<Vec<String>, ItemError> {
    let mut names = vec![String::new()];
    let mut rest = item;
    while !rest.is_empty() {
        let (literal, group, after) = match rest.find('[') {
            Some(open) => {
                let close = open + rest[open..].find(']').ok_or(ItemError::Unclosed)?;
                (&rest[..open], Some(&rest[open + 1..close]), &rest[close + 1..])
            }
            None => (rest, None, ""),
        };
        names.iter_mut().for_each(|n| n.push_str(literal));
        if let Some(group) = group {
            let numbers = expand_ranges(group)?;
            if names.len().saturating_mul(numbers.len()) > MAX_NAMES {
                return Err(ItemError::TooMany);
            }
            names = names.iter().flat_map(|n| numbers.iter().map(move |num| format!("{n}{num}"))).collect();
        }
        rest = after;
    }
    Ok(names)
}

/// `01-04,7` → `01 02 03 04 7`.
fn expand_ranges(group: &str) -> Result<Vec<String>, ItemError> {
    let mut out = Vec::new();
    for range in group.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let number = |s: &str| -> Result<u64, ItemError> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 18 {
                return Err(ItemError::NotARange { group: group.to_string(), range: range.to_string() });
            }
            s.parse().map_err(|_| ItemError::Unparsable { group: group.to_string() })
        };
        let (l, h) = (number(lo)?, number(hi)?);
        if l > h {
            return Err(ItemError::Backwards { group: group.to_string(), range: range.to_string() });
        }
        if h - l >= MAX_NAMES as u64 || out.len() + (h - l) as usize >= MAX_NAMES {
            return Err(ItemError::RangeTooLarge { group: group.to_string() });
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
            let err = expand(expr).expect_err(expr).to_string();
            assert!(err.contains(needle), "{expr}: {err}");
        }
    }

    /// Each problem has its kind and the words gres.conf's errors and the
    /// wrapper quoted before.
    #[test]
    fn each_problem_is_its_kind_with_todays_words() {
        let item = |expr: &str, problem| HostlistError::Item { expr: expr.into(), problem };
        let group = |g: &str| g.to_string();
        let cases = [
            ("n[1-2", HostlistError::Unclosed { expr: "n[1-2".into() }, "'[' without ']' in \"n[1-2\""),
            ("n1-2]", HostlistError::Unopened { expr: "n1-2]".into() }, "']' without '[' in \"n1-2]\""),
            ("n[[1]]", HostlistError::Nested { expr: "n[[1]]".into() }, "nested '[' in \"n[[1]]\""),
            ("a,,b", HostlistError::EmptyName { expr: "a,,b".into() }, "empty name in \"a,,b\""),
            ("n[2-1]", item("n[2-1]", ItemError::Backwards { group: group("2-1"), range: "2-1".into() }), "bad range [2-1]: 2-1 runs backwards in \"n[2-1]\""),
            ("n[1,a-b]", item("n[1,a-b]", ItemError::NotARange { group: group("1,a-b"), range: "a-b".into() }), "bad range [1,a-b]: \"a-b\" is not N or N-M in \"n[1,a-b]\""),
            ("n[0-99999]", item("n[0-99999]", ItemError::RangeTooLarge { group: group("0-99999") }), "range [0-99999] names more than 65536 hosts in \"n[0-99999]\""),
            ("a[0-999]b[0-999]", item("a[0-999]b[0-999]", ItemError::TooMany), "more than 65536 names in \"a[0-999]b[0-999]\""),
        ];
        for (expr, kind, text) in cases {
            let err = expand(expr).expect_err(expr);
            assert_eq!((&err, err.to_string().as_str()), (&kind, text), "{expr}");
        }
        // The whole expression over the limit, each item within it.
        let many = (0..3).map(|i| format!("r{i}n[0-30000]")).collect::<Vec<_>>().join(",");
        assert_eq!(expand(&many), Err(HostlistError::TooMany { expr: many.clone() }));
        assert_eq!(expand(&many).unwrap_err().to_string(), format!("{many:?} names more than 65536 hosts"));
        // Not reachable through expand (its bracket check comes first).
        assert_eq!(expand_item("n[1").unwrap_err().to_string(), "'[' without ']'");
        assert_eq!(ItemError::Unparsable { group: group("x") }.to_string(), "bad range [x]");
    }
}
