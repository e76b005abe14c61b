"""The model-based tuner's cost model: a quadratic ridge regression fitted on the measured points.

DeepSpeed fits XGBoost; a tuning space has tens of points and a handful of measurements, where a
smooth quadratic surface with a little ridge penalty ranks the unmeasured points well and needs no
extra package: each knob and its square at first, the products of pairs too once the measurements
outnumber the terms (fitting them earlier lets noise steer the search). Plain Python: the systems are tiny.
"""

from __future__ import annotations

from collections.abc import Sequence

RIDGE = 1e-3


def quadratic_terms(x: Sequence[float], cross: bool = True) -> list[float]:
    """1, each feature, each square and (with `cross`) each product of two."""
    terms = [1.0, *x, *(v * v for v in x)]
    if cross:
        terms += [x[i] * x[j] for i in range(len(x)) for j in range(i + 1, len(x))]
    return terms


class QuadraticModel:
    """fit(rows, targets) then predict(rows); before a fit every prediction is 0."""

    def __init__(self, ridge: float = RIDGE) -> None:
        self.ridge = ridge
        self.weights: list[float] | None = None
        self.scale = 1.0
        self.cross = True

    def fit(self, rows: Sequence[Sequence[float]], targets: Sequence[float]) -> None:
        if not rows:
            self.weights = None
            return
        self.scale = max((abs(t) for t in targets), default=1.0) or 1.0
        # Products of pairs only once there are measurements enough to pin them down.
        self.cross = len(rows) >= len(quadratic_terms(rows[0]))
        design = [quadratic_terms(r, self.cross) for r in rows]
        ys = [t / self.scale for t in targets]
        n = len(design[0])
        gram = [[sum(row[i] * row[j] for row in design) for j in range(n)] for i in range(n)]
        for i in range(1, n):  # the intercept is not penalised
            gram[i][i] += self.ridge
        gram[0][0] += 1e-12
        rhs = [sum(row[i] * y for row, y in zip(design, ys)) for i in range(n)]
        self.weights = _solve(gram, rhs)

    def predict(self, rows: Sequence[Sequence[float]]) -> list[float]:
        if self.weights is None:
            return [0.0 for _ in rows]
        return [self.scale * sum(w * t for w, t in zip(self.weights, quadratic_terms(r, self.cross))) for r in rows]


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the matrix is symmetric positive definite)."""
    n = len(rhs)
    a = [[*row, b] for row, b in zip(matrix, rhs)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if abs(a[col][col]) < 1e-300:
            continue
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            if factor:
                for c in range(col, n + 1):
                    a[r][c] -= factor * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        if abs(a[r][r]) < 1e-300:
            continue
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x
