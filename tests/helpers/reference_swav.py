"""Independent reference implementations the tests compare the plugin (and VISSL) against.

Written from the papers, not from the plugin's code, in float64 and as plainly as
possible, so that a test comparing against them checks the maths and not a copy of the
implementation:

* :func:`paper_sinkhorn` -- the Sinkhorn-Knopp pseudo-code of the SwAV paper (Caron et al.
  2020, Algorithm 1 / App. A.1), dense, one process.
* :func:`reference_swav_loss` -- SwAV's swapped-prediction loss with multi-crop (Sec. 3.1,
  Eq. 1-3 and Sec. 3.2), averaged as the official code does.
* :func:`reference_knn` -- the weighted kNN classifier of Wu et al. 2018 (the kNN
  benchmark of the papers and of VISSL), in NumPy.

A plain module (``tests/`` is not a package: VISSL owns the name); import it as
``from reference_swav import paper_sinkhorn``.
"""
import numpy as np
import torch

def paper_sinkhorn(scores, eps=0.05, niters=3):
    """The SwAV paper's Sinkhorn-Knopp pseudo-code (Algorithm 1 / App. A.1), verbatim
    semantics: ``Q = exp(scores / eps)^T`` scaled to sum 1, then ``niters`` rounds of
    rescaling the rows (prototypes) to ``1/K`` and the columns (samples) to ``1/B``; the
    codes are the columns renormalised to sum 1.

    Args:
        scores: ``[B, K]`` prototype scores ``z^T c`` (float64 for a reference).
        eps: the entropy-regularisation epsilon (0.05 in the paper).
        niters: Sinkhorn iterations (3 in the paper).

    Returns:
        ``[B, K]`` soft codes ``q``; each row sums to 1.
    """
    Q = torch.exp(scores / eps).T
    Q /= torch.sum(Q)
    K, B = Q.shape
    r, c = torch.ones(K, dtype=Q.dtype) / K, torch.ones(B, dtype=Q.dtype) / B
    for _ in range(niters):
        u = torch.sum(Q, dim=1)
        Q *= (r / u).unsqueeze(1)
        Q *= (c / torch.sum(Q, dim=0)).unsqueeze(0)
    return (Q / torch.sum(Q, dim=0, keepdim=True)).T


def reference_swav_loss(scores_per_head, num_crops, crops_for_assign, temperature, epsilon, iters):
    """SwAV's swapped-prediction loss with multi-crop, from the paper (Sec. 3.1-3.2).

    For each code crop ``i`` in ``crops_for_assign``, its codes ``q_i`` come from
    :func:`paper_sinkhorn` (no gradient), and every other crop ``v`` predicts them:
    ``l(z_v, q_i) = - sum_k q_i^(k) log softmax(z_v^T c / temperature)^(k)`` (Eq. 2),
    averaged over the batch.  The loss averages these terms over ``v != i``, then over
    ``i``, then over the prototype heads (the official code's averaging).

    Args:
        scores_per_head: one ``[num_crops * B, K_h]`` score tensor per prototype head,
            crops stacked crop-major (crop 0's batch first); autograd flows through the
            predictions.
        num_crops: crops per image (2 + V with multi-crop).
        crops_for_assign: indices of the crops whose codes are predicted (``[0, 1]``).
        temperature: softmax temperature tau (0.1 in the paper).
        epsilon, iters: Sinkhorn parameters (see :func:`paper_sinkhorn`).

    Returns:
        The scalar loss (dtype of the scores).
    """
    losses = []
    for scores in scores_per_head:
        bs = scores.shape[0] // num_crops
        crop_losses = []
        for c in crops_for_assign:
            with torch.no_grad():
                q = paper_sinkhorn(scores[c * bs:(c + 1) * bs], epsilon, iters)
            terms = [-(q * torch.log_softmax(scores[v * bs:(v + 1) * bs] / temperature, dim=1)).sum(1).mean()
                     for v in range(num_crops) if v != c]
            crop_losses.append(sum(terms) / len(terms))
        losses.append(sum(crop_losses) / len(crop_losses))
    return sum(losses) / len(losses)


def reference_knn(train_x, train_y, test_x, test_y, k, sigma, l2_norm):
    """Weighted kNN (Wu et al. 2018, VISSL's benchmark): the ``k`` train features most
    similar to a test feature (dot product, cosine when ``l2_norm``) vote for their labels
    with weight ``exp(similarity / sigma)``; the classes are ranked by their summed votes.

    Args:
        train_x, test_x: ``[N, D]`` / ``[M, D]`` features (arrays or tensors).
        train_y, test_y: integer labels (any shape with N / M entries).
        k: number of neighbours.
        sigma: vote temperature (0.07 or 0.1).
        l2_norm: L2-normalise the features first.

    Returns:
        ``(top1, top5)`` accuracies in percent.  NumPy, float64.
    """
    tr, te = np.asarray(train_x, np.float64), np.asarray(test_x, np.float64)
    if l2_norm:
        tr = tr / np.linalg.norm(tr, axis=1, keepdims=True)
        te = te / np.linalg.norm(te, axis=1, keepdims=True)
    train_y = np.asarray(train_y).reshape(-1)
    test_y = np.asarray(test_y).reshape(-1)
    num_classes = int(train_y.max()) + 1
    top1 = top5 = 0
    for f, y in zip(te, test_y):
        sim = tr @ f
        nn = np.argsort(-sim, kind="stable")[:k]
        votes = np.zeros(num_classes)
        for j in nn:
            votes[train_y[j]] += np.exp(sim[j] / sigma)
        order = np.argsort(-votes, kind="stable")
        top1 += int(order[0] == y)
        top5 += int(y in order[:5])
    n = len(test_y)
    return 100.0 * top1 / n, 100.0 * top5 / n
