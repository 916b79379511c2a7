#!/usr/bin/env bash
# Submit command of the local stand-in cluster (profiles/local-cluster): runs one Snakemake
# jobscript in its own background process and session, prints its job id (the process id) and
# appends "job id <TAB> rule <TAB> jobscript" to the spool's submitted.tsv.
# The spool folder is $QWEN_ONNX_CLUSTER_SPOOL, else .snakemake/local-cluster in the working
# directory (Snakemake calls the submit and status commands from there). Each job writes its
# output to <job id>.log and, when it ends, its exit status to <job id>.exit (read by status.sh).
set -euo pipefail
jobscript=$1
spool=${QWEN_ONNX_CLUSTER_SPOOL:-.snakemake/local-cluster}
mkdir -p "$spool"
spool=$(cd "$spool" && pwd)
# The jobscript's second line is "# properties = {...JSON...}" with the job's rule.
rule=$(grep -m1 -o '"rule": *"[^"]*"' "$jobscript" | sed 's/.*"\([^"]*\)"$/\1/')
# setsid: its own process group, so that cancel.sh ends the job with everything it started;
# in a non-interactive shell the background child is no group leader, so setsid keeps its pid.
setsid nohup bash -c 'exec >"$2/$$.log" 2>&1; bash "$1"; echo $? >"$2/$$.exit.tmp"; mv "$2/$$.exit.tmp" "$2/$$.exit"' \
  local-cluster-job "$jobscript" "$spool" </dev/null >/dev/null 2>&1 &
jobid=$!
printf '%s\t%s\t%s\n' "$jobid" "${rule:-?}" "$jobscript" >>"$spool/submitted.tsv"
echo "$jobid"
