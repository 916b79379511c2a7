#!/usr/bin/env bash
# Status command of the local stand-in cluster (profiles/local-cluster): prints success, failed
# or running for a job id printed by submit.sh, from the job's exit file or its process.
set -euo pipefail
jobid=$1
spool=${QWEN_ONNX_CLUSTER_SPOOL:-.snakemake/local-cluster}
exit_status() {
  if [ -f "$spool/$jobid.exit" ]; then
    if [ "$(cat "$spool/$jobid.exit")" = 0 ]; then echo success; else echo failed; fi
    return 0
  fi
  return 1
}
exit_status && exit 0
if kill -0 "$jobid" 2>/dev/null; then
  echo running
else
  # the job may have written its exit file between the two checks
  exit_status || echo failed
fi
