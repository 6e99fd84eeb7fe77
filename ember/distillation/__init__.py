"""Knowledge distillation: a large teacher teaches a small student.

- ``losses``: the loss functions and layer maps (Hinton KD, DistilBERT, TinyBERT, Patient KD);
- ``student``: the student's shape and initialisation (random, pre-trained, every other
  teacher layer);
- ``transfer_set``: unlabeled text / task text labelled once by the teacher (cached logits);
- ``kd``: ``TaskDistiller``, the module the Trainer trains for task-level methods;
- ``pkd``, ``tinybert``, ``distilbert``: each method's extra losses/modules;
- ``task_run`` / ``pretrain_run``: what `ember distill` runs (fine-tuned teacher -> student run
  folder; pre-trained teacher + corpus -> pre-training run folder).
"""
