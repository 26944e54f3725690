"""Writes the walk-through's data for the churn classifier: synthetic customers, the model
trained on them (weights.pt), held-out reference customers with their labels (reference.npz:
an array per forward argument and `y`) and one request body. Stand-ins for real data."""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from model import ChurnNet

out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/churn")
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)


def customers(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    numeric = rng.normal(size=(n, 6)).astype(np.float32)
    plan = rng.integers(0, 5, size=(n, 1))
    risk = numeric[:, 0] - 0.8 * numeric[:, 1] + 0.6 * (plan[:, 0] == 4) + rng.normal(0, 0.3, n)
    return numeric, plan, (risk > 0).astype(np.int64)


torch.set_num_threads(1)
numeric, plan, y = customers(3000)
model = ChurnNet()
optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
x_num, x_plan = torch.from_numpy(numeric), torch.from_numpy(plan)
target = torch.from_numpy(y).float()[:, None]
for _ in range(200):
    optimizer.zero_grad()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x_num, x_plan), target)
    loss.backward()
    optimizer.step()
torch.save(model.state_dict(), out / "weights.pt")
numeric, plan, y = customers(500)
np.savez(out / "reference.npz", numeric=numeric, plan=plan, y=y)
body = {"numeric": numeric[0].round(4).tolist(), "plan": plan[0].tolist()}
(out / "request.json").write_text(json.dumps(body))
print(f"wrote {out}/weights.pt (loss {loss.item():.3f}), reference.npz (500) and request.json")
