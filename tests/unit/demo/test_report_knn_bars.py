"""The report's kNN panel draws the random inits' min-max as error bars: with one init both
ends are the value itself, stored unrounded while the value shown is rounded, and the panel
must still draw (matplotlib refuses a negative error bar: the quick demo with
``--random-inits 1`` used to stop at its report)."""
import matplotlib

matplotlib.use("Agg")


def test_one_random_init_whose_range_is_a_rounding_off_the_value_draws():
    import matplotlib.pyplot as plt

    from vissl_swav_plugin.demo.report import _plot_knn

    one = {"knn20": 68.9, "knn200": 59.4, "nn5_euclid": 68.1}
    results = {
        "swav": {"knn20": 78.8, "knn200": 72.9, "nn5_euclid": 78.5},
        "random_init": {**one, "per_init": [dict(one)],
                        "range": {k: [v + 1e-12, v + 1e-12] for k, v in one.items()}},
        "raw_pixels": {"knn20": 79.1, "knn200": 70.9, "nn5_euclid": 80.2},
    }
    fig, ax = plt.subplots()
    _plot_knn(ax, results, {"n_train": 5000, "n_test": 1000})
    heights = sorted(round(p.get_height(), 6) for p in ax.patches if p.get_height() > 0)
    assert heights == sorted([78.8, 72.9, 78.5, 68.9, 59.4, 68.1, 79.1, 70.9, 80.2])
    plt.close(fig)
