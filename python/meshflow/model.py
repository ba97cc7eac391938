"""Model files (DESIGN's "Models"): load, run, train and explain from Python."""

from . import _meshflow


class Model:
    """A model file. ``Model.load(path)``; ``.run()``, ``.train(steps)``, ``.generate(weights,
    prompt)``, ``.explain()``."""

    def __init__(self, handle, path=None):
        self._h = handle
        self.path = path  # the model file it was loaded from

    @classmethod
    def load(cls, path):
        return cls(_meshflow.load_model(str(path)), str(path))

    def run(self, overlap=False, threads_per_device=None):
        """Runs the forward pass; returns {name: numpy.ndarray} of the model's outputs.

        ``threads_per_device`` (``--threads-per-device``): the threads each device computes
        with (None: this machine's cores divided by the devices, at least 1).
        """
        return _meshflow.run_model(self._h, overlap,
                                   None if threads_per_device is None else int(threads_per_device))

    def train(self, steps, lr=None, optimizer=None, momentum=None, betas=None, eps=None,
              weight_decay=None, clip_grad_norm=None, warmup_steps=None, decay=None,
              decay_steps=None, check=False, overlap=False, allow_nonfinite=False,
              micro_batches=None, zero=None, checkpoint=None, checkpoint_every=None,
              keep_last=None, resume=None, threads_per_device=None, schedule=None,
              eval_every=None, eval_batches=20, log_dir=None, timeout=60, recompute=None):
        """Trains ``steps`` steps; returns the dict ``meshflow train --json`` prints.

        The options are ``meshflow train``'s (torch.optim's names): ``optimizer`` "sgd" or
        "adamw"; ``lr`` (None: the optimizer's default, 0.1 or 0.001); sgd's ``momentum``;
        adamw's ``betas`` (b1, b2), ``eps``, ``weight_decay``; ``clip_grad_norm``;
        ``warmup_steps``, ``decay`` ("none", "cosine", "linear") and ``decay_steps``. An
        option left None takes the model file's "train" object's value, then the default.
        A step whose loss or gradient norm is not finite raises unless ``allow_nonfinite``.
        ``micro_batches`` splits each step's inputs along dim 0, accumulating the gradients.
        ``zero`` is the ZeRO level: 0, 1 (optimizer state sharded over the data-parallel
        dims) or 3 (FSDP: weights and gradients too, each weight gathered for each use).
        ``checkpoint`` (a folder) writes ``checkpoint/step-<k>/`` after the last step and after
        every ``checkpoint_every``-th, keeping the newest ``keep_last``; ``resume`` (a folder,
        or one ``step-<k>`` in it) loads the newest complete checkpoint onto this model's
        layouts, its steps going on from k + 1 (``meshflow.checkpoint.list`` lists them);
        ``resume="auto"`` resumes from ``checkpoint``'s newest complete checkpoint when there is
        one (else starts at step 1) with ``steps`` the last step number, so one call serves the
        first run and every restart.
        ``threads_per_device`` is ``run``'s. Where the model's layers lie on different meshes
        (stages), ``schedule`` ("gpipe", "1f1b" or "zb"; None: the model file's, else "1f1b")
        is the order the stages run their micro-batches in, all at once; each step's dict then
        has its measured "bubble". ``recompute`` ("none", "selective" or "full"; None: the
        model file's, else "none") is the activation recomputation (docs/training.md): which
        forward values backward makes again instead of keeping them.
        A model with a "data" object reads each step's batch from its dataset (docs/data.md);
        ``eval_every`` evaluates the mean loss over ``eval_batches`` val batches after every
        such step and the last ("evals" in the dict); ``log_dir`` gains metrics.jsonl and
        loss.svg. ``timeout`` (``--timeout``) is how many seconds a device may keep its peers
        waiting before the run fails on every device (docs/failures.md).
        """
        options = dict(optimizer=optimizer, lr=lr, momentum=momentum, betas=betas, eps=eps,
                       weight_decay=weight_decay, clip_grad_norm=clip_grad_norm,
                       warmup_steps=warmup_steps, decay=decay, decay_steps=decay_steps)
        return _meshflow.train_model(self._h, int(steps), options, bool(check), overlap,
                                     bool(allow_nonfinite),
                                     None if micro_batches is None else int(micro_batches),
                                     None if zero is None else int(zero),
                                     None if checkpoint is None else str(checkpoint),
                                     None if checkpoint_every is None else int(checkpoint_every),
                                     None if keep_last is None else int(keep_last),
                                     None if resume is None else str(resume),
                                     None if threads_per_device is None
                                     else int(threads_per_device),
                                     None if schedule is None else str(schedule),
                                     None if eval_every is None else int(eval_every),
                                     int(eval_batches),
                                     None if log_dir is None else str(log_dir), float(timeout),
                                     None if recompute is None else str(recompute))

    def generate(self, weights, prompt, max_new_tokens=100, num_samples=1, temperature=1.0,
                 top_k=None, top_p=None, seed=0, stop=None, tokenizer=None, cache=True):
        """Continues ``prompt`` on the model's own meshes; returns the dict ``meshflow generate
        --json`` prints: {"samples": [{"tokens", "text", "logprobs"}], "prompt_tokens",
        "prefill_s", "decode_s", "tokens_per_s"}.

        ``weights`` is a ``--save`` folder or a checkpoint (a folder or its ``step-<k>``), in
        any layouts. ``prompt`` is a str (encoded by ``tokenizer``, a ``data prepare`` folder)
        or a list of token ids. ``temperature`` 0 is greedy; ``top_k``, ``top_p`` and ``seed``
        are the sampling rule's (the same tokens on any mesh); a sample ends once its text ends
        with a string of ``stop`` (a str or a list); ``cache=False`` runs the whole context for
        every new token (the reference the KV cache equals). docs/generate.md.
        """
        stops = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        ids = prompt if isinstance(prompt, str) else [int(i) for i in prompt]
        return _meshflow.generate_model(
            self._h, str(weights), ids, int(max_new_tokens), int(num_samples), float(temperature),
            None if top_k is None else int(top_k), None if top_p is None else float(top_p),
            int(seed), [str(s) for s in stops], None if tokenizer is None else str(tokenizer),
            bool(cache))

    def explain(self, overlap=False, lr=None, optimizer=None, momentum=None, betas=None,
                eps=None, weight_decay=None, clip_grad_norm=None, warmup_steps=None, decay=None,
                decay_steps=None, micro_batches=None, zero=None, threads_per_device=None,
                schedule=None, recompute=None, machine=None):
        """Returns the dict ``meshflow explain --json`` prints for the step ``train`` with the
        same options would run: every value's layout (optimizer state included), every move,
        for a model with a loss ``est_step_s``, ``memory_per_device_bytes`` and ``recompute``
        (the recomputed nodes per backward segment), and ``schedule`` and ``est_bubble`` (None
        unless the model runs on stages).

        ``machine`` is ``meshflow explain --machine``: a description file (``meshflow
        calibrate --out``), ``"default"`` (the built-in description), or None: this machine's,
        measured the first time and cached."""
        options = dict(optimizer=optimizer, lr=lr, momentum=momentum, betas=betas, eps=eps,
                       weight_decay=weight_decay, clip_grad_norm=clip_grad_norm,
                       warmup_steps=warmup_steps, decay=decay, decay_steps=decay_steps)
        return _meshflow.explain_model(self._h, overlap, options,
                                       None if micro_batches is None else int(micro_batches),
                                       None if zero is None else int(zero),
                                       None if threads_per_device is None
                                       else int(threads_per_device),
                                       None if schedule is None else str(schedule),
                                       None if recompute is None else str(recompute),
                                       None if machine is None else str(machine))


def autoshard(path, mesh=None, memory_limit=None, out=None, optimizer=None, lr=None,
              momentum=None, betas=None, eps=None, weight_decay=None, clip_grad_norm=None,
              warmup_steps=None, decay=None, decay_steps=None, zero=None, micro_batches=None,
              machine=None, threads_per_device=None, recompute=None):
    """Chooses the placements of every tensor and node of model file ``path``, its ZeRO level,
    micro-batch count and activation recomputation for the fastest estimated step within
    ``memory_limit`` bytes per device (``meshflow autoshard``); returns the dict ``meshflow
    autoshard --json`` prints.

    ``mesh`` ("4", "2x2") searches on one mesh of that shape instead of the model's own;
    ``zero``, ``micro_batches`` and ``recompute``, where given, are kept; the optimizer options are ``train``'s;
    ``machine`` is as ``Model.explain``'s (None: this machine's measured description). ``out``
    writes the chosen model file, which ``Model.load(out).train(...)`` runs as it is. No choice fits: raises
    InvalidArgumentError giving the least memory any choice needs."""
    options = dict(optimizer=optimizer, lr=lr, momentum=momentum, betas=betas, eps=eps,
                   weight_decay=weight_decay, clip_grad_norm=clip_grad_norm,
                   warmup_steps=warmup_steps, decay=decay, decay_steps=decay_steps)
    return _meshflow.autoshard(str(path), None if mesh is None else str(mesh),
                               None if memory_limit is None else int(memory_limit),
                               None if out is None else str(out), options,
                               None if zero is None else int(zero),
                               None if micro_batches is None else int(micro_batches),
                               None if machine is None else str(machine),
                               None if threads_per_device is None else int(threads_per_device),
                               None if recompute is None else str(recompute))
