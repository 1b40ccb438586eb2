import json, os
from kvmesh.serve import Mesh
from kvmesh.torch import LlamaModel

p = json.load(open("train/recall/eval.json"))["prompts"][200]     # a RAG prompt, as token IDs
model = LlamaModel.from_pretrained("train/recall")                 # any HF Llama-family checkpoint
with Mesh.connect(os.environ["KVMESH_ADDR"], model) as mesh:
    mesh.store(p["chunks"], context="after", prefix=p["system"])   # the passages, encoded once
    print(mesh.generate([p["system"]] + p["chunks"], p["question"], stop=2), p["answer"])
