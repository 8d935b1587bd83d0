#!/bin/bash
# Interleaved A/B of two hvdlite trees: old (d837253) and new (main).
# one host: 2 ranks train step, none+fp16; 2x2 emulated hosts: hosts_train case.
export UCX_TLS=self,sm OMP_NUM_THREADS=1 PATH=/work/main/.venv/bin:$PATH
cd /tmp/ab
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for t in $order; do
    if [ $t = old ]; then tree=/work/wt-old; else tree=/work/main; fi
    (cd $tree && PYTHONPATH=$tree timeout 1200 env -u UCX_TLS python bench/run.py --cases hosts_train \
        --set hosts_train_layouts=2x2 --set hosts_train_rounds=3 --set hosts_train_steps=2 \
        --out-dir /tmp/ab/hosts-$t-$i > /tmp/ab/hosts-$t-$i.log 2>&1)
    echo "hosts $t $i rc=$?"
  done
done
echo ALLDONE
