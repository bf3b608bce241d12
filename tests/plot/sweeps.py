"""Synthetic runs in the sweep layout, for the plot tests."""

import json

import numpy as np

from embodied.sweep import names


def write_sweep(root, tasks, seeds, method='dreamerv3', steps=60000,
                every=1001, slope=1 / 60, seed=0, start=0):
    """Runs `<index>-<task>-<method>-<seed>/scores.jsonl` under `root` (as
    `embodied.sweep` names them, from index `start`): one
    episode about every `every` env steps (jittered, so that the steps are
    uneven as a real run's are) scoring about `slope * step`, capped at
    1000. Returns {(task, seed): (steps, scores)}."""
    rng = np.random.default_rng(seed)
    written = {}
    index = start
    for task in tasks:
        for run_seed in seeds:
            folder = root / names.folder(index, task, method, run_seed)
            index += 1
            folder.mkdir(parents=True)
            xs, ys = [], []
            step = 0
            while True:
                step += every + int(rng.integers(0, 60))
                if step > steps:
                    break
                xs.append(step)
                ys.append(float(np.clip(
                    slope * step + rng.normal(0, 40), 0, 1000)))
            with open(folder / 'scores.jsonl', 'w') as f:
                for x, y in zip(xs, ys):
                    f.write(json.dumps({
                        'step': x, 'episode/score': y,
                        'episode/length': 1000}) + '\n')
            written[(task, run_seed)] = (np.array(xs, float), np.array(ys))
    return written
