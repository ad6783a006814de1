#!/usr/bin/env bash
# Runs a plan of benchmark steps on the device machine, detached from the call that starts it,
# so that the machine's 10-minute call limit and the calls that carry vLLM's pieces do not cut
# it short. Each plan line is `NAME SECONDS COMMAND...` (`#` comments and blank lines skipped;
# words split on spaces, no quoting; `{results}` stands for the results folder, `infer` for
# the CLI run from this checkout);
# a step whose NAME starts with `vllm:` first waits for /tmp/vllm_ready (written by the call
# that ran vLLM's install.sh). Progress goes to $RESULTS/progress.log, each step's output to
# $RESULTS/NAME.log. See DEVICE_PLAN.md for the calls around it.
#
#   setsid nohup bash benchmarks/device_session.sh PLAN [RESULTS] > /tmp/session.log 2>&1 < /dev/null &
set -u
plan=$(realpath "$1")
results=${2:-/tmp/res}
mkdir -p "$results"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=5 PYTHONPATH="/tmp/site:$PWD/src"
export INFER_SCOREBOARD=${INFER_SCOREBOARD:-/tmp/scoreboard.json}
[ -f "$INFER_SCOREBOARD" ] || cp benchmarks/results/scoreboard.json "$INFER_SCOREBOARD"
vllm_env=(env "PYTHONPATH=/tmp/vsite:$PYTHONPATH" VLLM_USE_FLASHINFER_SAMPLER=0)
infer_cli=(python3 -c 'import sys; from infer.cli import main; sys.exit(main(sys.argv[1:]))')

log() { echo "$(date +%T) $*" >> "$results/progress.log"; }

while read -r name limit command; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    prefix=()
    if [[ "$name" == vllm:* ]]; then
        name=${name#vllm:}
        until [ -f /tmp/vllm_ready ]; do sleep 2; done
        prefix=("${vllm_env[@]}")
    fi
    read -r -a words <<< "${command//\{results\}/$results}"
    [[ "${words[0]}" == infer ]] && words=("${infer_cli[@]}" "${words[@]:1}")
    log "start $name"
    started=$SECONDS
    timeout -k 10 "$limit" "${prefix[@]}" "${words[@]}" > "$results/$name.log" 2>&1
    log "end $name rc=$? $((SECONDS - started))s"
done < "$plan"
log "ALL DONE"
