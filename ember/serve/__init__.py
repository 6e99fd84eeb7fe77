"""Export and CPU serving of fine-tuned (and MLM / GPT pre-trained) ember runs.

    graph.py       a run's provider (task adapter / pre-training objective) and its inference
                   model as one graph: ids -> (head logits, every layer's states)
    quantize.py    int8 dynamic quantization of the Linear layers, saved as safetensors
    onnx_export.py ONNX export (dynamic batch/sequence axes) and ONNX Runtime int8 quantization
    runners.py     one calling convention over PyTorch fp32/int8, ONNX Runtime and HF models
    inputs.py      texts -> padded id arrays; real verification sentences
    verify.py      exported vs original: max |logit difference|, prediction agreement, speed
    export.py      `ember export`: the formats above, verified, written atomically
    predictor.py   runs the model's inference methods (ember.tasks.inference.methods: classify, tag,
                   answer, fill-mask, embed, generate, ...) over one batched forward
    batching.py    the micro-batching queue (asyncio front, one worker thread)
    requests.py    request bodies: size limit, JSON object (fields: each method's own parse)
    app.py         the FastAPI app and `ember serve`'s uvicorn runner
"""

# The ways a run folder can be run (``ember.serve.runners``; ``ember.load(backend=...)``). Here, in
# the package's torch-free top, so ``ember.api`` can check a name without importing the runners.
BACKENDS = ("torch", "int8", "bf16", "onnx", "onnx-int8")
