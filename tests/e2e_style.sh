#!/usr/bin/env bash
# The layout rules every C file keeps (../shared/style.md, "Formatting"; settings in .clang-format):
# at most 100 columns, counted in characters, spaces not tabs, no trailing whitespace. Only the
# sources are read, so it runs the same in every build, sanitized or not.
source "$(dirname "$0")/e2e_lib.sh"
cd "$CSD_SOURCE_DIR"
mapfile -t files < <(find src tests fuzz tools -name '*.[ch]' | sort)
[ "${#files[@]}" -gt 100 ] || fail "found only ${#files[@]} C files under $CSD_SOURCE_DIR"

check() { # description, grep pattern
    local hits
    hits=$(LC_ALL=C.UTF-8 grep -nE "$2" "${files[@]}" || true)
    [ -z "$hits" ] || fail "$1 (clang-format -i --lines=N:N FILE fixes most):
$(echo "$hits" | cut -c1-160 | head -20)"
}
check "lines over 100 columns" '.{101,}'
check "tab characters" $'\t'
check "trailing whitespace" '[[:space:]]+$'
echo "style: ${#files[@]} C files within 100 columns, no tabs, no trailing whitespace"
