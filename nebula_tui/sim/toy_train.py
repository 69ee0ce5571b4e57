"""A stand-in trainer for the simulated lab's python image (``/workspace/train.py``): reads
the files under ``data/``, reports the cards it was given, and "trains" for a few steps; on
SIGUSR1 (a GPU being isolated) it writes a checkpoint and stops, as a real trainer should."""

import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=3e-4)
args = parser.parse_args()


def checkpoint(signum, frame):
    print(f"SIGUSR1: checkpoint written at step {step}", flush=True)
    sys.exit(0)


signal.signal(signal.SIGUSR1, checkpoint)
files = sorted(os.listdir("data")) if os.path.isdir("data") else []
size = sum(os.path.getsize(os.path.join("data", f)) for f in files)
cards = os.environ.get("CUDA_VISIBLE_DEVICES", "")
devices = sorted(d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit())
print(f"job {os.environ.get('NEBULA_JOB_ID')}: {len(files)} data files ({size} bytes) in "
      f"{os.getcwd()}/data; cards {cards or 'none'} ({', '.join(devices) or 'no device nodes'})")
step = 0
for epoch in range(1, args.epochs + 1):
    for _ in range(args.steps):
        step += 1
        time.sleep(0.2)
    print(f"epoch {epoch}/{args.epochs}: {step} steps, lr {args.lr}, "
          f"loss {2.0 / (1 + step * args.lr * 1000):.3f}", flush=True)
