#!/bin/bash
# One-host interleaved A/B: previous engine (d837253) vs final tree, 2 ranks.
export UCX_TLS=self,sm OMP_NUM_THREADS=1 PATH=/work/main/.venv/bin:$PATH
cd /tmp/ab
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for t in $order; do
    if [ $t = old ]; then tree=/work/wt-old; else tree=/work/main; fi
    (cd $tree && PYTHONPATH=$tree timeout 900 mpiexec -n 2 python bench/train_step.py --modes nocomm,hvdlite \
        --compression none,fp16,topk --rounds 4 --steps 4 --json /tmp/ab/q-$t-$i.json > /tmp/ab/q-$t-$i.log 2>&1)
    echo "q $t $i rc=$?"
  done
done
echo ALLDONE
