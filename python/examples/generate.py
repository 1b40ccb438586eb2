from kvmesh.torch import LlamaModel

model = LlamaModel.from_pretrained("train/recall", device="cpu")   # or "cuda"; dtype=None: float32
prompt = [1, 7, 8, 9, 10, 11, 2]
print(model.generate(prompt, max_new_tokens=4, stop=2))            # greedy, the plain baseline
