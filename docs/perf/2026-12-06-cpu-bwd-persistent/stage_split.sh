#!/usr/bin/env bash
# Part a of `../shared/device/cutedsl-bundle` (47.5 MB) and this repository's tracked files
# (19.4 MB) no longer fit one device call's 64 MiB. Run from the repo root after the bundle
# script: it splits part a into .devpkgs/a1 and .devpkgs/a2, staged by two calls,
#   carry [".devpkgs/a1"]  command: bash .devpkgs/a1/install.sh
#   carry [".devpkgs/a2"]  command: bash .devpkgs/a2/install.sh
# before part b's call (run.sh b or all), all on the same warm machine.
set -euo pipefail
cd .devpkgs
rm -rf a1 a2 && mkdir a1 a2
split -b 24M a/a.tar.xz part.
mv part.aa a1/ && mv part.ab a2/
cat > a1/install.sh <<'INST'
#!/usr/bin/env bash
set -e
mkdir -p /opt/cutedsl && cp "$(dirname "$0")/part.aa" /opt/cutedsl/ && echo "half 1 of part a copied"
INST
cat > a2/install.sh <<'INST'
#!/usr/bin/env bash
set -e
mkdir -p /opt/cutedsl/site
cat /opt/cutedsl/part.aa "$(dirname "$0")/part.ab" | xz -dc | tar -C /opt/cutedsl/site -xf -
rm /opt/cutedsl/part.aa; touch /opt/cutedsl/a.done; echo "staged part a"
INST
du -sh a1 a2
