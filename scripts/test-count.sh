#!/bin/sh
# The count of a test.sh run, from what it printed and the testkit's notes:
#   scripts/test-count.sh OUTPUT NOTES
# OUTPUT: every part's output (test.sh tees it there). Counted: each
# libtest `test result:` line (passed, failed; its `ignored` are skipped),
# whichever part printed it, and `test-install: N passed, N failed`.
# NOTES: the testkit's notes file (tools/testkit): its SKIPPED and
# SUBSTITUTED lines, one per test that did not run as its name says.
# Prints one line saying what was counted, then
#   tests: N passed, N failed, N skipped
#   substituted: N
# (CI's reader takes `N passed, N failed[, N skipped]` alone on a line
# after one word and a colon: substituted gets a line of its own.)
set -eu
output=$1
notes=$2
[ -f "$output" ] || output=/dev/null
[ -f "$notes" ] || notes=/dev/null
awk -v notes="$notes" '
    # "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; ..."
    /test result:/ {
        for (i = 2; i <= NF; i++) {
            if ($i == "passed;") passed += $(i - 1)
            if ($i == "failed;") failed += $(i - 1)
            if ($i == "ignored;") ignored += $(i - 1)
        }
        results++
    }
    /^test-install: [0-9]+ passed, [0-9]+ failed$/ { passed += $2; failed += $4; results++ }
    END {
        while ((getline line < notes) > 0) {
            if (line ~ /^SKIPPED /) skipped++
            if (line ~ /^SUBSTITUTED /) substituted++
        }
        printf "== counted: %d result lines (cargo test --workspace on Slurm 22.05, test-slurm-debian.sh on 24.11 and 26.05, test-install.sh); skipped: the testkit notes (%d) and libtest ignored (%d)\n", results, skipped, ignored
        printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, skipped + ignored
        printf "substituted: %d\n", substituted
    }
' "$output"
