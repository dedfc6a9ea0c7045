//! A set of metric label values (a failure's or a drain's `reason`): each a
//! plain word of its own, and each named in the metrics page, so that a
//! dashboard can rely on the list there.

/// Panics naming the label that is empty or not `[a-z_]`, appears twice, or
/// is not in `doc` as `` `label` ``. `what` names the set in the message.
pub fn assert_metric_labels(what: &str, labels: &[&str], doc: &str) {
    for (i, label) in labels.iter().enumerate() {
        assert!(!label.is_empty() && label.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{what}: label {label:?} is not a plain word");
        assert!(!labels[..i].contains(label), "{what}: label {label} twice");
        assert!(doc.contains(&format!("`{label}`")), "{what}: docs/metrics.md does not name the label {label}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_set_is_refused_with_its_label_named() {
        let doc = "`a_b` and `c`";
        assert_metric_labels("ok", &["a_b", "c"], doc);
        for (labels, part) in [(&["a_b", "a_b"][..], "a_b twice"), (&["Up"][..], "\"Up\" is not a plain word"), (&["d"][..], "does not name the label d")] {
            let err = std::panic::catch_unwind(|| assert_metric_labels("set", labels, doc)).unwrap_err();
            let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains(part), "{msg}");
        }
    }
}
