"""ai.onnx.ml ops (LabelEncoder, TreeEnsemble, ArrayFeatureExtractor, Binarizer) and TfIdfVectorizer:
numbers against ONNX Runtime, LabelEncoder-1 import, and refusals."""
from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler.errors import ModelError
from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.ops import OpError, lookup
from compiler.ir.ops import ml as M
from compiler.ir.types import DType, TensorType
from frontends.onnx import import_model

RNG = np.random.default_rng(0)
ML = "ai.onnx.ml"


def _model(op_type, feeds, attrs, domain=ML, ml_opset=5, opset=21, outputs=("Y",)):
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds]
    node = helper.make_node(op_type, [n for n, _ in feeds], list(outputs), domain=domain, **attrs)
    outs = [helper.ValueInfoProto(name=o) for o in outputs]
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(ML, ml_opset)]
    return helper.make_model(helper.make_graph([node], "t", vis, outs), opset_imports=imports, ir_version=9)


def _run(model, feeds):
    g = import_model(model)
    return g, interpret(g, dict(feeds))


def _vs_ort(op_type, feeds, attrs, rtol=1e-6, atol=1e-6, **kw):
    model = _model(op_type, feeds, attrs, **kw)
    g, got = _run(model, feeds)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, dict(feeds))[0]
    out = got[g.output_names[0]]
    assert out.dtype == ref.dtype and out.shape == ref.shape == g.outputs[0].type.shape, (out.shape, ref.shape)
    if out.dtype == object:
        assert out.tolist() == ref.tolist()
    else:
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)
    return out


def _tensor(name, arr):
    arr = np.asarray(arr)
    if arr.dtype.kind in "OUS":
        return helper.make_tensor(name, TensorProto.STRING, arr.shape, [s.encode() for s in arr.ravel()])
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape, arr.ravel().tolist())


# ---------------------------------------------------------------------------------------------
# LabelEncoder
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("keys,values,x,attrs", [
    (dict(keys_strings=["a", "b", "c"]), dict(values_int64s=[1, 2, 3]), np.array(["a", "z", "c"], object),
     dict(default_int64=-7)),
    (dict(keys_int64s=[5, 6, 8]), dict(values_strings=["x", "y", "z"]), np.array([[5, 6], [7, 8]], np.int64),
     dict(default_string="?")),
    (dict(keys_floats=[0.5, float("nan"), 2.0]), dict(values_floats=[1.0, 9.0, 3.0]),
     np.array([0.5, np.nan, 2.0, 4.0], np.float32), {}),
    (dict(keys_int64s=[1, 2]), dict(values_floats=[0.25, 0.75]), np.array([2, 1, 3], np.int64),
     dict(default_float=5.5)),
])
def test_label_encoder_lists(keys, values, x, attrs):
    _vs_ort("LabelEncoder", [("X", x)], {**keys, **values, **attrs}, ml_opset=4)


def _tensor_table(kdt, vdt):
    keys = np.array(["p", "q", "r"], object) if kdt is object else np.array([3, 1, 4], kdt)
    vals = np.array(["P", "Q", "R"], object) if vdt is object else np.array([10, 20, 30], vdt)
    default = np.array(["none"], object) if vdt is object else np.array([-5], vdt)
    x = (np.array(["q", "s", "p", "r"], object) if kdt is object else np.array([1, 4, 9, 3], kdt))
    return keys, vals, default, x


@pytest.mark.parametrize("kdt,vdt", [(np.int64, np.float64), (np.float32, object), (np.float64, np.int64),
                                     (object, np.int16), (np.int64, object), (np.float32, np.float32)])
def test_label_encoder_tensors(kdt, vdt):
    keys, vals, default, x = _tensor_table(kdt, vdt)
    attrs = dict(keys_tensor=_tensor("k", keys), values_tensor=_tensor("v", vals), default_tensor=_tensor("d", default))
    _vs_ort("LabelEncoder", [("X", x)], attrs, ml_opset=4)


@pytest.mark.parametrize("kdt,vdt", [(np.int32, np.float64), (np.int16, np.int16), (np.float64, np.int32)])
def test_label_encoder_tensors_onnxruntime_lacks(kdt, vdt):
    """Key/value types ONNX Runtime has no kernel for, checked by hand."""
    keys, vals, default, x = _tensor_table(kdt, vdt)
    attrs = dict(keys_tensor=_tensor("k", keys), values_tensor=_tensor("v", vals), default_tensor=_tensor("d", default))
    g, got = _run(_model("LabelEncoder", [("X", x)], attrs, ml_opset=4), [("X", x)])
    assert got["Y"].dtype == vdt and got["Y"].tolist() == [20, 30, -5, 10]


def test_label_encoder_tensor_default_by_kind():
    """Tensor values without default_tensor: -1 for integers (and "_Unused" for strings)."""
    op = M.LabelEncoder(keys_strings=("a",), values_tensor=np.array([4], np.int32))
    assert op.compute(np.array(["a", "b"], object))[0].tolist() == [4, -1]
    op = M.LabelEncoder(keys_int64s=(1,), values_tensor=np.array(["one"], object))
    assert op.compute(np.array([1, 2], np.int64))[0].tolist() == ["one", "_Unused"]


def test_label_encoder_last_repeated_key_wins():
    """As the ONNX spec says (ONNX Runtime keeps the first)."""
    op = M.LabelEncoder(keys_int64s=(1, 2, 1), values_int64s=(10, 20, 30))
    assert op.compute(np.array([1, 2], np.int64))[0].tolist() == [30, 20]
    op = M.LabelEncoder(keys_strings=("a", "a"), values_int64s=(1, 2))
    assert op.compute(np.array(["a"], object))[0].tolist() == [2]


@pytest.mark.parametrize("x,classes,attrs,want", [
    (np.array(["b", "q", "a"], object), ["a", "b", "a"], dict(default_int64=-9), [1, -9, 0]),
    (np.array([2, 0, 5], np.int64), ["a", "b", "c"], dict(default_string="none"), ["c", "a", "none"]),
])
def test_label_encoder_opset_1(x, classes, attrs, want):
    model = _model("LabelEncoder", [("X", x)], dict(classes_strings=classes, **attrs), ml_opset=1)
    g, got = _run(model, [("X", x)])
    assert got["Y"].tolist() == want


@pytest.mark.parametrize("attrs,match", [
    (dict(values_int64s=(1,)), "exactly one of keys_floats"),
    (dict(keys_int64s=(1,), keys_strings=("a",), values_int64s=(1,)), "are all set"),
    (dict(keys_int64s=(1,)), "exactly one of values_floats"),
    (dict(keys_int64s=(1, 2), values_int64s=(1,)), "same length"),
    (dict(keys_tensor=np.zeros((2, 2), np.int64), values_int64s=(1, 2)), "1-D"),
    (dict(keys_tensor=np.zeros(2, np.uint8), values_int64s=(1, 2)), "element type u8"),
    (dict(keys_int64s=(1,), values_tensor=np.array([1], np.int32), default_tensor=np.array([1, 2], np.int32)),
     "one element"),
    (dict(keys_int64s=(1,), values_tensor=np.array([1], np.int32), default_tensor=np.array([1], np.int64)),
     "default_tensor has element type i64"),
])
def test_label_encoder_bad_attributes(attrs, match):
    with pytest.raises(OpError, match=match):
        M.LabelEncoder(**attrs)


def test_label_encoder_input_must_match_keys():
    g = Graph()
    x = g.add_input("x", TensorType(DType.i32, (3,)))
    with pytest.raises(OpError, match="X has element type i32, but the keys are i64"):
        g.add(M.LabelEncoder(keys_int64s=(1,), values_int64s=(2,)), x)


# ---------------------------------------------------------------------------------------------
# TreeEnsemble
# ---------------------------------------------------------------------------------------------

def _forest(trees=4, depth=3, features=3, targets=3, dtype=np.float32, modes=range(7), seed=1):
    """A random forest in the opset-5 encoding: full binary trees whose last level points at leaves."""
    rng = np.random.default_rng(seed)
    nodes = dict(modes=[], feat=[], split=[], tid=[], tleaf=[], fid=[], fleaf=[], track=[])
    leaves_t, leaves_w, roots, members = [], [], [], []

    def leaf():
        leaves_t.append(int(rng.integers(targets)))
        leaves_w.append(float(rng.normal()))
        return len(leaves_t) - 1

    def build(level):
        i = len(nodes["modes"])
        for k in nodes:
            nodes[k].append(0)
        mode = int(rng.choice(list(modes)))
        nodes["modes"][i] = mode
        nodes["feat"][i] = int(rng.integers(features))
        nodes["split"][i] = float(rng.integers(-2, 3)) / 2
        nodes["track"][i] = int(rng.integers(2))
        if mode == 6:
            members.extend(sorted(set(rng.integers(-3, 4, size=2).astype(float).tolist())) + [float("nan")])
        for side in ("t", "f"):
            if level == depth - 1 or rng.random() < 0.2:
                nodes[side + "id"][i], nodes[side + "leaf"][i] = leaf(), 1
            else:
                nodes[side + "id"][i], nodes[side + "leaf"][i] = build(level + 1), 0
        return i

    for _ in range(trees):
        roots.append(build(0))
    attrs = dict(n_targets=targets, tree_roots=roots,
                 nodes_modes=_tensor("m", np.array(nodes["modes"], np.uint8)),
                 nodes_featureids=nodes["feat"], nodes_splits=_tensor("s", np.array(nodes["split"], dtype)),
                 nodes_truenodeids=nodes["tid"], nodes_trueleafs=nodes["tleaf"],
                 nodes_falsenodeids=nodes["fid"], nodes_falseleafs=nodes["fleaf"],
                 nodes_missing_value_tracks_true=nodes["track"],
                 leaf_targetids=leaves_t, leaf_weights=_tensor("w", np.array(leaves_w, dtype)))
    if members:
        attrs["membership_values"] = _tensor("mv", np.array(members, dtype))
    return attrs


def _tree_input(n=40, features=3, dtype=np.float32):
    """Whole numbers (ONNX Runtime's set membership truncates to integers), NaN for some."""
    x = RNG.integers(-3, 4, size=(n, features)).astype(dtype)
    x[RNG.random(x.shape) < 0.1] = np.nan
    return x


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tree_ensemble_aggregates(aggregate, dtype):
    attrs = _forest(dtype=dtype, seed=aggregate)
    _vs_ort("TreeEnsemble", [("X", _tree_input(dtype=dtype))], dict(attrs, aggregate_function=aggregate),
            rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("post", [3, 4])
def test_tree_ensemble_post_transforms(post):
    """SOFTMAX_ZERO and PROBIT against ONNX Runtime (its probit uses a coarse erfinv: atol 1e-3)."""
    attrs = _forest(seed=10 + post, targets=1 if post == 4 else 3)
    if post == 4:  # probit needs scores in (0, 1)
        w = np.abs(np.array(attrs["leaf_weights"].float_data, np.float32)) % 0.2 + 0.01
        attrs["leaf_weights"] = _tensor("w", w.astype(np.float32))
    _vs_ort("TreeEnsemble", [("X", _tree_input())], dict(attrs, post_transform=post), rtol=1e-4,
            atol=1e-3 if post == 4 else 1e-6)


def test_tree_ensemble_softmax_and_logistic():
    """SOFTMAX is 1 and LOGISTIC 2, as the ONNX spec says (ONNX Runtime 1.x swaps the two)."""
    attrs = _forest(seed=21)
    x = _tree_input()
    raw = _vs_ort("TreeEnsemble", [("X", x)], attrs, rtol=1e-5, atol=1e-6).astype(np.float64)
    _, soft = _run(_model("TreeEnsemble", [("X", x)], dict(attrs, post_transform=1)), [("X", x)])
    e = np.exp(raw - raw.max(axis=1, keepdims=True))
    np.testing.assert_allclose(soft["Y"], e / e.sum(axis=1, keepdims=True), rtol=1e-6)
    _, logistic = _run(_model("TreeEnsemble", [("X", x)], dict(attrs, post_transform=2)), [("X", x)])
    np.testing.assert_allclose(logistic["Y"], 1 / (1 + np.exp(-raw)), rtol=1e-6)


def test_tree_ensemble_only_comparisons_no_nan_tracking():
    attrs = _forest(trees=6, depth=4, modes=range(6), seed=7)
    del attrs["nodes_missing_value_tracks_true"]
    _vs_ort("TreeEnsemble", [("X", _tree_input(n=64))], attrs, rtol=1e-5, atol=1e-6)


def test_erfinv():
    y = np.linspace(-0.999, 0.999, 201)
    x = M._erfinv(y)
    back = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(back, y, atol=2e-7)


def test_tree_ensemble_unreached_target_is_zero_for_min_max():
    attrs = _forest(trees=1, depth=1, targets=4, seed=3)
    op = M.TreeEnsemble(**{k: v for k, v in _op_attrs(attrs).items()}, aggregate_function=2)
    y = op.compute(np.zeros((2, 3), np.float32))[0]
    assert (y == 0).sum() >= 2 * 3


def _op_attrs(attrs):
    from onnx import numpy_helper

    return {k: (numpy_helper.to_array(v) if isinstance(v, TensorProto) else v) for k, v in attrs.items()}


@pytest.mark.parametrize("change,match", [
    (dict(tree_roots=None), "tree_roots is required"),
    (dict(nodes_featureids=(0,)), "nodes_falseleafs has"),
    (dict(aggregate_function=4), "aggregate_function"),
    (dict(post_transform=7), "post_transform"),
    (dict(nodes_modes=np.array([9, 0, 0], np.uint8)), "nodes_modes must be 0..6"),
    (dict(nodes_truenodeids=(1, 0, 9)), "out of range"),
    (dict(tree_roots=(5,)), "tree_roots"),
    (dict(n_targets=1), "leaf_targetids must lie"),
    (dict(nodes_modes=np.array([6, 0, 0], np.uint8)), "BRANCH_MEMBER"),
    (dict(leaf_weights=np.ones(3)), "leaf_weights has 3"),
])
def test_tree_ensemble_bad_attributes(change, match):
    base = dict(n_targets=2, tree_roots=(0,), nodes_modes=np.array([0, 0, 0], np.uint8), nodes_featureids=(0, 0, 0),
                nodes_splits=np.array([3.14, 1.2, 4.2]), nodes_truenodeids=(1, 0, 1), nodes_trueleafs=(0, 1, 1),
                nodes_falsenodeids=(2, 2, 3), nodes_falseleafs=(0, 1, 1), leaf_targetids=(0, 1, 0, 1),
                leaf_weights=np.array([5.23, 12.12, -12.23, 7.21]))
    M.TreeEnsemble(**base)
    with pytest.raises(OpError, match=match):
        M.TreeEnsemble(**{**base, **change})


def test_tree_ensemble_types_must_match_input():
    op = M.TreeEnsemble(n_targets=1, tree_roots=(0,), nodes_modes=np.array([0], np.uint8), nodes_featureids=(2,),
                        nodes_splits=np.array([0.5]), nodes_truenodeids=(0,), nodes_trueleafs=(1,),
                        nodes_falsenodeids=(0,), nodes_falseleafs=(1,), leaf_targetids=(0,),
                        leaf_weights=np.array([1.0]))
    g = Graph()
    with pytest.raises(OpError, match="nodes_splits has element type f64, X has f32"):
        g.add(op, g.add_input("x", TensorType(DType.f32, ("N", 3))))
    with pytest.raises(OpError, match="use feature 2, X has 2 features"):
        g.add(op, g.add_input("y", TensorType(DType.f64, ("N", 2))))
    y = g.add(op, g.add_input("z", TensorType(DType.f64, ("N", 3))))
    assert y.type == TensorType(DType.f64, ("N", 1))
    with pytest.raises(OpError, match="2-D"):
        g.add(op, g.add_input("w", TensorType(DType.f64, (3,))))


# ---------------------------------------------------------------------------------------------
# ArrayFeatureExtractor, Binarizer
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("xshape,idx", [((4,), [2, 0]), ((3, 4), [3]), ((2, 3, 4), [1, 1, 3]),
                                        ((3, 4), [[0, 1], [2, 3]])])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, object])
def test_array_feature_extractor(xshape, idx, dtype):
    x = np.arange(np.prod(xshape)).reshape(xshape)
    x = x.astype(str).astype(object) if dtype is object else x.astype(dtype)
    _vs_ort("ArrayFeatureExtractor", [("X", x), ("Y", np.array(idx, np.int64))], {}, outputs=("Z",))


def test_array_feature_extractor_refusals():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (3, 4)))
    with pytest.raises(OpError, match="out of range"):
        g.add(M.ArrayFeatureExtractor(), x, g.add_constant(np.array([4], np.int64)))
    with pytest.raises(OpError, match="Y \\(the indices\\) has element type i32"):
        g.add(M.ArrayFeatureExtractor(), x, g.add_constant(np.array([1], np.int32)))
    with pytest.raises(OpError, match="X has element type f16"):
        g.add(M.ArrayFeatureExtractor(), g.add_input("h", TensorType(DType.f16, (3,))),
              g.add_constant(np.array([1], np.int64)))


def test_binarizer():
    x = (RNG.standard_normal((3, 5)) * 3).astype(np.float32)
    _vs_ort("Binarizer", [("X", x)], dict(threshold=0.3))


@pytest.mark.parametrize("dtype,threshold", [(np.float64, -0.5), (np.int64, 1.0), (np.int32, 0.5)])
def test_binarizer_types_onnxruntime_lacks(dtype, threshold):
    x = (RNG.standard_normal((3, 5)) * 3).astype(dtype)
    x.flat[0] = threshold if dtype is np.float64 else 1
    g, got = _run(_model("Binarizer", [("X", x)], dict(threshold=threshold)), [("X", x)])
    assert got["Y"].dtype == dtype
    np.testing.assert_array_equal(got["Y"], (x > threshold).astype(dtype))


def test_binarizer_refuses_strings():
    g = Graph()
    with pytest.raises(OpError, match="X has element type string"):
        g.add(M.Binarizer(), g.add_input("x", TensorType(DType.string, (3,))))


def test_ml_ops_live_in_their_domain():
    assert lookup("TreeEnsemble", ML) is M.TreeEnsemble and lookup("TreeEnsemble") is None
    assert lookup("TfIdfVectorizer") is M.TfIdfVectorizer
    model = _model("Binarizer", [("X", np.zeros(3, np.float32))], {}, domain="")
    with pytest.raises(Exception, match="not supported"):
        import_model(model)


# ---------------------------------------------------------------------------------------------
# TfIdfVectorizer
# ---------------------------------------------------------------------------------------------

_POOL = dict(ngram_counts=[0, 4, 10], ngram_indexes=[0, 1, 2, 3, 4, 5, 6, 7, 8],
             pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 5, 6, 8, 3, 3, 3])


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("lo,hi,skip", [(1, 1, 0), (1, 2, 0), (2, 2, 3), (1, 3, 2), (3, 3, 1), (2, 3, 9)])
@pytest.mark.parametrize("shape", [(12,), (2, 6), (3, 8)])
def test_tfidf_ints(mode, lo, hi, skip, shape):
    x = RNG.integers(2, 9, size=shape).astype(np.int32 if len(shape) == 1 else np.int64)
    attrs = dict(_POOL, mode=mode, min_gram_length=lo, max_gram_length=hi, max_skip_count=skip)
    if mode != "TF":
        attrs["weights"] = [0.5, 1.5, 2.0, 1.0, 3.0, 0.25, 1.0, 2.5, 4.0]
    _vs_ort("TfIdfVectorizer", [("X", x)], attrs, domain="")


def test_tfidf_strings_and_output_coordinates():
    x = np.array([["a", "b", "a", "c", "b", "a"], ["c", "c", "b", "a", "zz", "b"]], object)
    attrs = dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=1, ngram_counts=[0, 2],
                 ngram_indexes=[4, 0, 2, 1], pool_strings=["a", "c", "b", "a", "c", "b"])
    _vs_ort("TfIdfVectorizer", [("X", x)], attrs, domain="")


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
def test_tfidf_shared_and_permuted_coordinates(mode):
    """In mode TF, n-grams given one output coordinate add their counts there (they overwrote each other);
    with weights, weight i is the i-th n-gram's wherever ngram_indexes puts it: as ONNX Runtime computes."""
    x = np.array([[1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], [5, 6, 5, 6, 7, 8, 7, 8, 6, 7, 2, 2]], np.int64)
    attrs = dict(mode=mode, min_gram_length=2, max_gram_length=2, max_skip_count=0, ngram_counts=[0, 0],
                 pool_int64s=[5, 6, 7, 8, 6, 7])
    if mode != "TF":
        attrs["weights"] = [0.5, 2.0, 3.0]
    for indexes in ([0, 0, 2], [1, 1, 1]) if mode == "TF" else ([2, 0, 1], [1, 2, 0]):
        _vs_ort("TfIdfVectorizer", [("X", x)], dict(attrs, ngram_indexes=indexes), domain="")


@pytest.mark.parametrize("change,match", [
    (dict(mode="BM25"), "mode"),
    (dict(min_gram_length=3, max_gram_length=2), "min_gram_length"),
    (dict(max_skip_count=-1), "max_skip_count"),
    (dict(pool_strings=["a"]), "exactly one of pool_int64s"),
    (dict(ngram_counts=[0, 1]), "does not hold whole 2-grams"),
    (dict(ngram_counts=[0, 5]), "offsets into the pool of 4 items"),
    (dict(ngram_indexes=[0, 1]), "ngram_indexes has 2"),
    (dict(weights=[1.0]), "weights has 1"),
    (dict(mode="IDF", ngram_indexes=(0, 1, 1)), "several n-grams one output coordinate"),
    (dict(ngram_counts=[3, 1]), "non-decreasing"),
    (dict(mode=None), "mode is required"),
])
def test_tfidf_bad_attributes(change, match):
    base = dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=0, ngram_counts=(0, 2),
                ngram_indexes=(0, 1, 2), pool_int64s=(1, 2, 1, 2))
    M.TfIdfVectorizer(**base)
    with pytest.raises(OpError, match=match):
        M.TfIdfVectorizer(**{**base, **change})


def test_tfidf_input_type_and_rank():
    op = M.TfIdfVectorizer(mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0, ngram_counts=(0,),
                           ngram_indexes=(0, 3), pool_int64s=(1, 2))
    g = Graph()
    y = g.add(op, g.add_input("x", TensorType(DType.i64, ("N", "C"))))
    assert y.type == TensorType(DType.f32, ("N", 4))
    with pytest.raises(OpError, match="X \\(pool_int64s is set\\) has element type string"):
        g.add(op, g.add_input("s", TensorType(DType.string, (3,))))
    with pytest.raises(OpError, match="1-D"):
        g.add(op, g.add_input("z", TensorType(DType.i64, (2, 3, 4))))


def test_import_errors_are_model_errors():
    model = _model("Binarizer", [("X", np.zeros(3, np.float16))], {})
    with pytest.raises(ModelError, match="Binarizer"):
        import_model(model)


def test_export_round_trip():
    """Export and re-import (the exporter declares ai.onnx.ml opset 1: the newer forms still import as is)."""
    from frontends.onnx.exporter import export_model

    g = Graph()
    s = g.add_input("s", TensorType(DType.string, (3,)))
    f = g.add_input("f", TensorType(DType.f32, ("N", 3)))
    le = g.add(M.LabelEncoder(keys_strings=("a", "b"), values_tensor=np.array([1, 2], np.int16),
                              default_tensor=np.array([7], np.int16)), s)
    te = g.add(M.TreeEnsemble(**_op_attrs(_forest(seed=5))), f)
    tf = g.add(M.TfIdfVectorizer(mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0, ngram_counts=(0,),
                                 ngram_indexes=(0, 1), pool_strings=("a", "b")), s)
    g.set_outputs([le, te, tf], ["le", "te", "tf"])
    feeds = {"s": np.array(["a", "c", "b"], object), "f": _tree_input(n=8)}
    want = interpret(g, feeds)
    got = interpret(import_model(export_model(g)), feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
