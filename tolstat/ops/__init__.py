"""Operator models keyed by torch function names: the inputs of the operator noise model.

The noise model of :mod:`tolstat.measure.noise` scales a run's error by, per output
element, ``u_out |ref_i| + u_acc sqrt(K) m_i (+ ...)``.
:func:`~tolstat.ops.registry.op_statistics` derives the magnitude ``m_i``, the reduction
length ``K`` and the row flag from exactly the arguments the torch function takes::

    st = tolstat.ops.op_statistics("layer_norm", (x, (n,), w, b), {"eps": 1e-5}, dtype="float16")
    record_statistics(out, ref, dtype="float16", magnitude=st.magnitude, K=st.K, rowwise=st.rowwise)

Inputs are numpy arrays or torch tensors of any dtype (the low-precision inputs the kernel
saw, converted exactly to float64); arguments bind to the torch signature with torch's
defaults, positionally or by keyword. ``docs/ops.md`` has the table of every op;
:func:`~tolstat.ops.registry.register` adds one, :func:`~tolstat.ops.registry.multilinear` is
the generic rule.

Why each magnitude is what it is
--------------------------------
The magnitude is the scale of the accumulated rounding error of an output element, to be
multiplied by ``u_acc * sqrt(K)`` (Higham & Mary's probabilistic bound of an inner product
of length ``K``: ``sqrt(K) u |x|^T |y|``). It is computed on the inputs as given.

* **Multilinear ops** (matmul, mm, bmm, linear, convolutions, addmm, baddbmm, add, mul):
  the op on absolute inputs, ``|A| @ |B|``, ``|x| @ |w|.T + |bias|``,
  ``beta |input| + alpha |A| @ |B|``. For an op linear in each input this is
  ``sum_j |∂y/∂x_j| |x_j|``, the componentwise condition of the output: a backward-stable
  kernel perturbs each term by a relative ``u``, and cancellation (``|ref|`` small) leaves
  this scale unchanged. ``K``: the inner dimension, ``in_channels / groups *
  prod(kernel_size)`` for a convolution (the length of each output's dot product).
* **softmax**: ``|ref|``. Each output is ``e_j / sum e``: the row sum's relative error
  carries over to every element in proportion to its value, and ``exp`` is relatively
  accurate. ``K`` = the row length.
* **log_softmax**: ``|x - max| + log(sum exp(x - max)) + 1``. The result is a difference of
  logs; its absolute error is the error of its arguments (``|x - max|``, evaluated with
  relative error ``u``) plus the relative error of the row sum (``+ 1`` for the log of a sum
  with relative error ``u``, ``log(sum)`` for that of the log itself).
* **layer_norm**: ``(|x - mu| + mean|x|) / sqrt(var + eps) * |w| + |b|``. The mean's error,
  of size ``u mean|x|`` (not ``u |x - mu|``), is amplified by ``1/sigma``: the cancellation
  of rows with a large common offset. **group_norm** is the same per group (over the
  group's channels and spatial positions), then the per-channel ``|weight|`` and ``|bias|``.
* **rms_norm**: ``|ref|``: no cancellation (``mean(x^2)`` sums nonnegative terms), a
  relative error ``u sqrt(N)`` of the mean square scales every output. ``eps=None`` is
  torch's default, the machine epsilon of the compute type (float32 for 16-bit inputs).
* **sum**, **mean**: ``sum |x|``, ``mean |x|`` (the reduction's multilinear rule); ``K`` the
  number of reduced elements.
* **var**: ``2 sum |x_i - mu| |x_i| / (N - correction)``. This is ``sum |∂var/∂x_i| |x_i|``
  (``∂var/∂x_i = 2 (x_i - mu) / (N - correction)``), the componentwise condition of the
  variance, the same rule as for the multilinear ops: a stable algorithm (two-pass or
  Welford, as GPU kernels use) has the error of a relative ``u`` perturbation of its
  inputs, and Welford's running-mean updates add errors of size ``u |mu| |x_i - mu|`` per
  term, which ``|x_i - mu| |x_i|`` covers. It is at least ``2 var`` (``sum (x - mu)^2 =
  sum (x - mu) x <= sum |x - mu| |x|``), so the rounding of the squares is covered too,
  and it grows with the offset ``|mu|`` where the one-pass ``E[x^2] - E[x]^2`` formula
  cancels (which it does not excuse beyond this scale: that formula's error is
  ``u mean(x^2)``, larger by ``|mu| / sigma``).
* **cumsum**: ``cumsum |x| * sqrt((j + 1) / N)`` with ``K = N``: element ``j`` sums ``j + 1``
  terms, so its error is ``u sqrt(j + 1) cumsum|x|_j = u sqrt(N) m_j``.
* **cross_entropy**: the loss of sample ``n`` is ``-w_y log_softmax(x_n)_y``; its magnitude
  is ``|w_y|`` times log_softmax's at the target (with label smoothing or probability
  targets, the same mix of the classes' magnitudes as the loss), 0 for ignored targets.
  ``reduction="sum"`` sums the samples' magnitudes, ``"mean"`` divides by the weights'
  sum as torch does. ``K`` = the class count ``C`` for ``"none"``; for a sum or mean of
  ``n`` losses ``K = C + n``: the per-sample errors add up (at most ``sqrt(C)`` times the
  summed magnitude) and the reduction adds its own ``sqrt(n) sum |loss|``.
* **scaled_dot_product_attention**: ``P @ |V|`` with ``P`` the exact probabilities (masks,
  causal masking, ``scale`` and grouped-query heads as given): the output is a convex
  combination of value rows, so ``P |V|`` is its multilinear magnitude in ``V``; the
  softmax's relative error scales the same terms. ``K`` = the key length.
* **gelu**: ``0.5 |x| (1 + |erf(x / sqrt 2)|)``: the cancellation in ``1 + erf`` for negative
  ``x`` (``|tanh(...)|`` in place of ``|erf|`` for ``approximate="tanh"``).
* **relu**: ``|relu(x)|``: exact (no rounding at all), so the output-rounding term alone
  already bounds a correct kernel; ``K = 1``.
* **tanh**: ``|ref|`` (relatively accurate, no cancellation).
* **sigmoid**: ``max(sigmoid(x), tiny_c / u_c)`` and **silu**: ``max(|x sigmoid(x)|, |x|
  tiny_c / u_c)``: ``|ref|``, plus the range of the compute format ``c`` (float32 for 16-bit
  outputs): ``exp(-x)`` overflows for ``x < -88.7``, so a correct kernel returns 0 (-0)
  where the exact value, below ``tiny_f32`` (``|x| tiny_f32``), is still a bfloat16 number.
  The term makes ``u_acc m_i >= tiny_c`` (``|x| tiny_c``) there.

Non-finite inputs are allowed: the magnitude is then non-finite where the op on the
absolute inputs is.

Tolerances from zero runs
-------------------------
:func:`~tolstat.ops.zero_run.tolerance` turns the same statistics into a threshold for a
kernel without calibration runs (``u_out |ref_i| + lambda(fp_budget / n) sqrt(K) u_acc m_i``,
the probabilistic bound with a union over the ``n`` output elements), labelled
model-based; :func:`~tolstat.ops.zero_run.fit_tolerance` fits its constant on a few runs
for tiny budgets per check.
"""

from tolstat._base.lazy import namespace as _namespace

__getattr__, __dir__ = _namespace(__name__, ("registry", "model", "zero_run"))
