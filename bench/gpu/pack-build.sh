#!/usr/bin/env bash
# Packs another commit's build into .gpu/old (ignored by git) for bench/gpu/ab-build.sh: its dist/
# (tests and maps left out), its migrations and package.json, about 1.2 MB, so that it travels beside
# .gpu/base, .gpu/app and dist within the 64 MiB a device call carries. It runs with this checkout's
# node_modules (Node resolves them from the parent folders), so REV must pin the same packages.
# Usage, from the checkout's root after `npm ci`: bash bench/gpu/pack-build.sh REV
set -euo pipefail
rev=${1:?usage: pack-build.sh REV}
old=.gpu/old
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
git diff --quiet "$rev" HEAD -- package.json package-lock.json || { echo "$rev pins other packages than HEAD"; exit 2; }
rm -rf "$old" && mkdir -p "$old"
git archive "$rev" | tar -x -C "$old"
ln -s "$PWD/node_modules" "$old/node_modules"
(cd "$old" && npx tsc -p . >/dev/null)
rm "$old/node_modules"
mkdir -p "$old/keep/src/db" && mv "$old/src/db/migrations" "$old/keep/src/db/" && mv "$old/dist" "$old/package.json" "$old/keep/"
find "$old" -mindepth 1 -maxdepth 1 -not -name keep -exec rm -rf {} +
mv "$old"/keep/* "$old"/ && rmdir "$old/keep"
find "$old/dist" \( -name '*.test.js' -o -name '*.map' \) -delete
cp bench/gpu/ab-build.sh "$old/ab.sh"
echo "$rev" > "$old/REV"
du -sh "$old"
