"""Export and CPU serving of fine-tuned (and MLM / GPT pre-trained) ember runs.

    graph.py       the task model as one inference graph: ids -> (logits, every layer's states)
    quantize.py    int8 dynamic quantization of the Linear layers, saved as safetensors
    onnx_export.py ONNX export (dynamic batch/sequence axes) and ONNX Runtime int8 quantization
    runners.py     one calling convention over PyTorch fp32/int8, ONNX Runtime and HF models
    inputs.py      texts -> padded id arrays; real verification sentences
    verify.py      exported vs original: max |logit difference|, prediction agreement, speed
    export.py      `ember export`: the formats above, verified, written atomically
    predictor.py   what each endpoint computes (classify, embed, fill-mask, tag, answer)
    generation.py  what /generate computes for GPT runs (ember.generate, batched by settings)
    batching.py    the micro-batching queue (asyncio front, one worker thread)
    requests.py    request-body parsing and validation (4xx with a message)
    app.py         the FastAPI app and `ember serve`'s uvicorn runner
"""
