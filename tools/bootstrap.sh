#!/usr/bin/env bash
# The old entry point, kept for hooks and scripts that still call it: the
# bootstrap is the generic script `init` generates (README.md, "Adopting
# warmstart in another repository"), the same one adopters use.
exec "$(dirname "${BASH_SOURCE[0]}")/warmstart-bootstrap.sh" "$@"
