"""Write tokens.txt: 512 lines of 17 token ids, each line counting up by a step of its own
(mod 32), so the next token follows from the ones before."""
import random

rng = random.Random(0)
with open("tokens.txt", "w") as f:
    for _ in range(512):
        start, step = rng.randrange(32), rng.randrange(1, 5)
        f.write(" ".join(str((start + step * i) % 32) for i in range(17)) + "\n")
