#!/usr/bin/env bash
# Cancel command of the local stand-in cluster (profiles/local-cluster): ends each given job's
# process group (the job's snakemake and the processes it started).
for jobid in "$@"; do
  kill -TERM -- "-$jobid" 2>/dev/null || kill -TERM "$jobid" 2>/dev/null || true
done
