#!/usr/bin/env bash
# Installs the TypeScript overstory (and Bun to run it) outside this repository, for figure 12's
# side-by-side run (bench/fig_sling.py; bench/RESULTS.md "Running it"). Reports only: no test needs it.
#
#   bash bench/setup_ts_overstory.sh SOURCE [DEST]
#   OV_BENCH_TS_OVERSTORY=DEST python bench/run.py --quick --only 12
#
# SOURCE  the TS tool's source: a git directory (bare or not; e.g. the one the session's `fetch` of
#         github:jayminwest/overstory returns) or a tarball of its tree (.tar, .tar.gz, .tgz; one top
#         folder is stripped).
# DEST    where to install (default /work/tsov); it ends up holding
#           bin/bun                 Bun's native binary (a link into bun-install/)
#           bun-install/            the npm package `bun` and its platform package
#           overstory/              the source, with its node_modules
#           ts-overstory.json       what was installed (bun, commit, mulch-cli), read by the bench
#
# Variables: TS_COMMIT (a git SOURCE's commit to check out; default its HEAD), BUN_VERSION (default
# 1.4.5), MULCH_VERSION (default 0.10.7: used only when the version in the TS tool's lockfile is not on
# the registry, as 0.6.2 is not here; its caret range is then replaced by ^MULCH_VERSION and the
# lockfile dropped).
#
# Needs only the npm registry (npm and bun use their usual configuration), git, tar and node/npm.
# Everything under DEST is left world-readable: the bench runs the TS tool as an unprivileged user
# when it runs as root (the TS `sling` refuses uid 0).
set -euo pipefail

SOURCE=${1:?usage: setup_ts_overstory.sh SOURCE [DEST]}
DEST=${2:-/work/tsov}
BUN_VERSION=${BUN_VERSION:-1.4.5}
MULCH_VERSION=${MULCH_VERSION:-0.10.7}

mkdir -p "$DEST/bin"
DEST=$(cd "$DEST" && pwd)

# 1. Bun, from the npm package `bun`: its postinstall moves the native binary of its optional
# dependency @oven/bun-linux-x64 to node_modules/bun/bin/bun.exe.
npm install --prefix "$DEST/bun-install" --no-audit --no-fund --loglevel=error "bun@$BUN_VERSION" >/dev/null
binary=""
for candidate in "$DEST/bun-install/node_modules/@oven/bun-linux-x64/bin/bun" \
                 "$DEST/bun-install/node_modules/bun/bin/bun.exe"; do
    if [ -f "$candidate" ] && [ "$(head -c 4 "$candidate" | od -An -c | tr -d ' ')" = "177ELF" ]; then
        binary=$candidate
        break
    fi
done
if [ -z "$binary" ]; then
    echo "setup_ts_overstory: no native bun binary under $DEST/bun-install (did the bun package's postinstall run?)" >&2
    exit 1
fi
ln -sfn "$binary" "$DEST/bin/bun"
bun_version=$("$DEST/bin/bun" --version)
export PATH="$DEST/bin:$PATH"

# 2. The source.
rm -rf "$DEST/overstory"
commit=""
if [ -d "$SOURCE" ]; then
    git clone -q --no-checkout "$SOURCE" "$DEST/overstory"
    commit=$(git -C "$DEST/overstory" rev-parse "${TS_COMMIT:-HEAD}^{commit}")
    git -C "$DEST/overstory" checkout -q --detach "$commit"
else
    mkdir -p "$DEST/overstory"
    tops=$(tar -tf "$SOURCE" | cut -d/ -f1 | sort -u | wc -l)
    if [ "$tops" -eq 1 ]; then
        tar -xf "$SOURCE" -C "$DEST/overstory" --strip-components=1
    else
        tar -xf "$SOURCE" -C "$DEST/overstory"
    fi
    commit=${TS_COMMIT:-"unknown (tarball $(basename "$SOURCE"))"}
fi

# 3. Its dependencies (commander, chalk, @os-eco/mulch-cli), from the registry.
cd "$DEST/overstory"
lockfile=kept
if ! bun install --production --frozen-lockfile >/dev/null 2>"$DEST/bun-install.log"; then
    cat "$DEST/bun-install.log" >&2
    echo "setup_ts_overstory: the locked versions are not all on the registry;" \
         "using @os-eco/mulch-cli ^$MULCH_VERSION without the lockfile" >&2
    bun pm pkg set "dependencies.@os-eco/mulch-cli=^$MULCH_VERSION"
    rm -f bun.lock
    bun install --production >/dev/null
    lockfile="dropped (@os-eco/mulch-cli ^$MULCH_VERSION)"
fi
mulch=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' node_modules/@os-eco/mulch-cli/package.json | head -n 1)
version=$("$DEST/bin/bun" src/index.ts --version)

cat >"$DEST/ts-overstory.json" <<EOF
{"bun": "$bun_version", "commit": "$commit", "version": "$version", "mulch_cli": "$mulch", "lockfile": "$lockfile"}
EOF
chmod -R a+rX "$DEST"
echo "TypeScript overstory $version at $commit, bun $bun_version, @os-eco/mulch-cli $mulch (lockfile $lockfile)"
echo "run figure 12 side by side with: OV_BENCH_TS_OVERSTORY=$DEST python bench/run.py --quick --only 12"
