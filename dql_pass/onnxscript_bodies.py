"""DynamicQuantizeLinear written with onnxscript: the single source of every variant's body.

:mod:`dql_pass.decomposition` builds the bodies from here and ships them, so that only building
them again imports onnxscript. The variants call shared scripts for the pieces they have in
common; onnx_ir's inliner flattens the calls.
"""

from __future__ import annotations

__all__ = ["scripts"]

import numpy as np
import onnx
import onnxscript
from onnxscript import FLOAT
from onnxscript import opset11 as op

from dql_pass import reference, variants


def _tensor(value, dtype=np.float32) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(value, dtype))


# The lean variant's slots: slot s stands for u in {s - centre, s - centre + 1}.
_LEAN_CENTRE = 384  # a subnormal scale puts x / scale within +-383
_LEAN_SLOTS = 2 * _LEAN_CENTRE + 1


def _lean_tables() -> tuple:
    """The lean variant's constant vectors and its answers' base (one entry per slot and one more)."""
    slots, centre = _LEAN_SLOTS, _LEAN_CENTRE
    m = np.arange(slots) - centre
    h = (m + 0.5).astype(np.float32)
    # Half the ulp of h, up where h rounds to the even m, down where to the odd m + 1.
    d = np.where(m % 2 == 0, 1, -1) * np.spacing(np.abs(h)) / 2
    # Slots m <= -256 (u <= -255: y is 0 whatever zp) are passed by every x above -inf: d = -inf makes
    # their threshold -inf for a scale above 0 and NaN (never passed) for the scale 0. The top slot,
    # reached only by +inf and by x > 0 under the scale 0, has the threshold b * 2^20: +inf for an
    # infinite scale (b near 2^114), 0 for the scale 0.
    d = np.where(m <= -256, -np.inf, d)
    h[-1], d[-1] = 2.0**20, 0.0
    phi = np.float32(2.0**-24 + 2.0**-47)
    # Entry j of the answers is clamp(j - count, 0, 255) (u = j - centre and zp = centre - count),
    # but entry 0 (x = -inf, NaN, x <= 0 under the scale 0) and entry `slots - 1` (x = +inf) are 0:
    # entry j is clamps[j + slots - count] (count <= slots), and those two read below `slots`.
    rows = np.arange(slots + 1) + slots
    rows[0] = rows[slots - 1] = slots
    clamps = np.clip(np.arange(2 * slots + 1) - slots, 0, 255)
    # The vectors are rows ([1, slots]): Gemm multiplies a [1, 1] scalar by them.
    return (_tensor([h]), _tensor([d]), _tensor([np.sign(h) * phi]), _tensor(rows, np.int32),
            _tensor(clamps, np.uint8), slots, _tensor(float(centre)), _tensor(centre, np.int32))


def scripts(zero_range: str) -> dict[str, onnxscript.OnnxFunction]:
    """Every variant as an onnxscript function, under ``zero_range``."""
    zero, qmax, one = _tensor(0.0), _tensor(255.0), _tensor(1.0)
    qmax64, flat, zero_1d = _tensor(255.0, np.float64), _tensor([-1], np.int64), _tensor([0.0])
    zero_range_value = _tensor(reference.zero_range_scale(zero_range))
    half, two, just_past_qmax = _tensor(0.5), _tensor(2.0), _tensor(256.0)
    # Rump, Zimmermann, Boldo and Melquiond's successor: v + (v * PHI + ETA) is the float after v > 0.
    phi, eta = _tensor(np.float32(2.0**-24 + 2.0**-47)), _tensor(np.float32(2.0**-149))
    splitter = _tensor(2.0**9 + 1)  # Veltkamp: 15 high bits and 9 low ones
    huge, tiny = _tensor(2.0**64), _tensor(2.0**-64)
    infinity, reciprocal_qmax = _tensor(np.inf), _tensor(np.float32(1) / np.float32(255))
    # Below 255 * 2^-126 the scale is subnormal (no float range rounds up to 2^-126 from there).
    subnormal_scale_range = _tensor(255 * 2.0**-126)
    wide, narrow, past_split = _tensor(2.0**100), _tensor(2.0**-100), _tensor(2.0**12)

    @onnxscript.script(default_opset=op)
    def extremes(x: FLOAT[...]):
        # The range always includes 0.
        q_min = op.Constant(value=zero)
        x_min = op.Min(op.ReduceMin(x, keepdims=0), q_min)
        x_max = op.Max(op.ReduceMax(x, keepdims=0), q_min)
        return x_min, x_max

    @onnxscript.script(default_opset=op)
    def extremes_never_empty(x: FLOAT[...]):
        # The reductions see x and one 0: the range includes 0 and a runtime whose reductions
        # refuse an empty tensor (PyTorch's) never gets one.
        with_zero = op.Concat(op.Reshape(x, op.Constant(value=flat)), op.Constant(value=zero_1d), axis=0)
        return op.ReduceMin(with_zero, keepdims=0), op.ReduceMax(with_zero, keepdims=0)

    @onnxscript.script(default_opset=op)
    def guarded_scale(x_range: FLOAT, scale_fp: FLOAT):
        # A zero range (all ±0, or empty) gets the policy's scale, never 0/0.
        q_min = op.Constant(value=zero)
        zero_range_scale = op.Constant(value=zero_range_value)
        return op.Where(op.Equal(x_range, q_min), zero_range_scale, scale_fp)

    @onnxscript.script(default_opset=op)
    def saturated_zero_point(x_min_quotient: FLOAT):
        # A NaN quotient (0/0, inf/inf) saturates to 255: Where is exact for NaN, Clip keeps it.
        q_min = op.Constant(value=zero)
        q_max = op.Constant(value=qmax)
        zero_point_fp = op.Sub(q_min, x_min_quotient)
        return op.Where(op.Less(zero_point_fp, q_max), zero_point_fp, q_max)

    @onnxscript.script(default_opset=op)
    def divide_in_float64(a: FLOAT, b: FLOAT):
        # A float64 quotient, cast back once, is the correctly rounded float32 quotient even where
        # the runtime divides through a reciprocal (see docs/SEMANTICS.md).
        return op.Cast(op.Div(op.Cast(a, to=onnx.TensorProto.DOUBLE), op.Cast(b, to=onnx.TensorProto.DOUBLE)),
                       to=onnx.TensorProto.FLOAT)

    @onnxscript.script(default_opset=op)
    def power_of_two_near_one(b: FLOAT):
        # A power of two that brings b > 0 into [2^-85, 2^64], exactly and without overflow.
        big = op.Constant(value=huge)
        small = op.Constant(value=tiny)
        unit = op.Constant(value=one)
        return op.Where(op.Greater(b, big), small, op.Where(op.Less(b, small), big, unit))

    @onnxscript.script(default_opset=op)
    def scale_exactly(x_range: FLOAT):
        # RN(x_range / 255) where Div multiplies by a float32 reciprocal: that quotient is at most
        # one ulp off, and the exact residual x_range - 255 * quotient says which neighbour is right.
        q_max = op.Constant(value=qmax)
        quotient = op.Div(x_range, q_max)
        step = op.Add(op.Mul(quotient, op.Constant(value=phi)), op.Constant(value=eta))
        up = op.Add(quotient, step)
        down = op.Sub(quotient, step)
        # (a - 256 q) + q is exact, scaled so that 256 q cannot overflow.
        k = power_of_two_near_one(x_range)
        a = op.Mul(x_range, k)
        q = op.Mul(quotient, k)
        twice_residual = op.Mul(op.Add(op.Sub(a, op.Mul(q, op.Constant(value=just_past_qmax))), q),
                                op.Constant(value=two))
        # The true quotient is past a neighbour's midpoint: 2 * residual beyond 255 * its ulp (never equal).
        # Only Less: OpenVINO's Greater is true for NaN.
        above = op.Less(op.Mul(op.Mul(op.Sub(up, quotient), k), q_max), twice_residual)
        below = op.Less(twice_residual, op.Mul(op.Mul(op.Sub(down, quotient), k), q_max))
        return op.Where(above, up, op.Where(below, down, quotient))

    @onnxscript.script(default_opset=op)
    def rounding_quotient(a: FLOAT[...], b: FLOAT):
        # A value whose Round is Round(RN(a / b)) for b > 0, where Div multiplies by a float32
        # reciprocal; for b 0 or inf it is that quotient. Only |a / b| <= 256.5 needs it exact.
        k = power_of_two_near_one(b)
        a_k = op.Mul(a, k)
        b_k = op.Mul(b, k)
        n = op.Round(op.Div(a_k, b_k))
        t = op.Mul(b_k, op.Constant(value=splitter))
        b_high = op.Sub(t, op.Sub(t, b_k))
        b_low = op.Sub(b_k, b_high)
        # n has at most 9 bits, so both products and a - n * b are exact, even if fused.
        residual = op.Sub(op.Sub(a_k, op.Mul(n, b_high)), op.Mul(n, b_low))
        direction = op.Sign(residual)
        half_integer = op.Add(n, op.Mul(direction, op.Constant(value=half)))
        magnitude = op.Abs(half_integer)
        ulp = op.Sub(op.Add(magnitude, op.Mul(magnitude, op.Constant(value=phi))), magnitude)
        # 2 |a - n b| - b: how far past the half integer the exact quotient lies, times 2 b.
        past = op.Sub(op.Mul(op.Abs(residual), op.Constant(value=two)), b_k)
        # RN(a / b) is the half integer itself when within half its ulp (never exactly at it).
        on_half = op.Less(op.Abs(past), op.Mul(ulp, b_k))
        q_min = op.Constant(value=zero)
        return op.Where(on_half, half_integer, op.Where(op.Less(q_min, past), op.Add(n, direction), n))

    @onnxscript.script(default_opset=op)
    def scale_and_zero_point(x: FLOAT[...]):
        x_min, x_max = extremes(x)
        x_range = op.Sub(x_max, x_min)
        q_max = op.Constant(value=qmax)
        y_scale = guarded_scale(x_range, op.Div(x_range, q_max))
        return y_scale, saturated_zero_point(op.Div(x_min, y_scale))

    @onnxscript.script(default_opset=op)
    def rounded(quotient: FLOAT[...], zero_point_sat: FLOAT):
        # Round before the zero point is added (ties go to even by the quotient); saturate last.
        q_min = op.Constant(value=zero)
        q_max = op.Constant(value=qmax)
        zero_point_rounded = op.Round(zero_point_sat)
        y_zero_point = op.Cast(zero_point_rounded, to=onnx.TensorProto.UINT8)
        y_fp = op.Add(op.Round(quotient), zero_point_rounded)
        y = op.Cast(op.Clip(y_fp, q_min, q_max), to=onnx.TensorProto.UINT8)
        return y, y_zero_point

    @onnxscript.script(default_opset=op)
    def quantizelinear(x: FLOAT[...]):
        y_scale, zero_point_sat = scale_and_zero_point(x)
        # QuantizeLinear with scale 1 rounds half to even, saturates and casts in one node.
        unit_scale = op.Constant(value=one)
        y_zero_point = op.QuantizeLinear(zero_point_sat, unit_scale)
        y = op.QuantizeLinear(x, y_scale, y_zero_point)
        return y, y_scale, y_zero_point

    @onnxscript.script(default_opset=op)
    def arithmetic(x: FLOAT[...]):
        y_scale, zero_point_sat = scale_and_zero_point(x)
        # Division, not a reciprocal.
        y, y_zero_point = rounded(op.Div(x, y_scale), zero_point_sat)
        return y, y_scale, y_zero_point

    @onnxscript.script(default_opset=op)
    def float64(x: FLOAT[...]):
        x_min, x_max = extremes_never_empty(x)
        # float32: in float64, [3e38, -3e38] would get a finite scale.
        x_range = op.Sub(x_max, x_min)
        q_max64 = op.Constant(value=qmax64)
        scale_fp = op.Cast(op.Div(op.Cast(x_range, to=onnx.TensorProto.DOUBLE), q_max64), to=onnx.TensorProto.FLOAT)
        y_scale = guarded_scale(x_range, scale_fp)
        zero_point_sat = saturated_zero_point(divide_in_float64(x_min, y_scale))
        y, y_zero_point = rounded(divide_in_float64(x, y_scale), zero_point_sat)
        return y, y_scale, y_zero_point

    @onnxscript.script(default_opset=op)
    def residual(x: FLOAT[...]):
        x_min, x_max = extremes_never_empty(x)
        x_range = op.Sub(x_max, x_min)
        y_scale = guarded_scale(x_range, scale_exactly(x_range))
        zero_point_sat = saturated_zero_point(rounding_quotient(x_min, y_scale))
        y, y_zero_point = rounded(rounding_quotient(x, y_scale), zero_point_sat)
        return y, y_scale, y_zero_point

    # The portable variant: exact when every Div may be 3 ulp off (WGSL allows 2.5), products
    # may be fused into the sums that read them, subnormals may be flushed (only inputs with a
    # subnormal x or y_scale change) and a comparison may compare float bits as int32 (MNN).
    # Hence: no Round, Sign, QuantizeLinear, Equal, Greater or float64; every Add or Sub reads
    # exact products only (where it reads an inexact one, the fused sum is as good), so that
    # contraction changes nothing; every Less has +0, a positive constant or an Abs first, or a
    # positive constant second, which an int32 compare of the bits gets right, -0 included (and
    # Less, unlike OpenVINO's Greater, is false for NaN). Zero and infinite scales are handled by
    # scalar guards; only an infinite x (with an infinite scale) makes NaN, in values its result
    # does not depend on.

    @onnxscript.script(default_opset=op)
    def quotient_by_qmax(a: FLOAT):
        # RN(a / 255) without Div, for 2^-64 <= a <= 2^64 or a below 255 * 2^-126 (gradual underflow).
        # The product with float32(1/255) is within 2 ulp; with its exact residual a - 255 q the
        # corrected quotient is within 2^-21 ulp of a / 255, which stays 1/510 ulp from a midpoint.
        # Max keeps the rounded product out of the sums: fused, they would read the exact one.
        q = op.Max(op.Mul(a, op.Constant(value=reciprocal_qmax)), op.Constant(value=zero))
        residual = op.Add(op.Sub(a, op.Mul(q, op.Constant(value=just_past_qmax))), q)
        return op.Add(q, op.Mul(residual, op.Constant(value=reciprocal_qmax)))

    @onnxscript.script(default_opset=op)
    def rounded_half_even(
        a: FLOAT[...], b: FLOAT, b_high: FLOAT, b_low: FLOAT, b_half: FLOAT, b_twice: FLOAT, offset: FLOAT
    ):
        # round_half_even(RN(a / b)) + offset for 2^-100 <= b <= 2^100 (b = b_high + b_low, 12 bits
        # each), exact for |a / b| < 511 whatever the Div returns within a few ulp; and whether a
        # is finite. No Where picks between two tensors: ORT's CPU kernel is 40 times slower then.
        point_five = op.Constant(value=half)
        q_min = op.Constant(value=zero)
        floor = op.Floor(op.Div(a, b))
        half_integer = op.Add(floor, point_five)
        # The half integer has at most 10 bits, so both products are exact, and so is a - h b near h.
        residual = op.Sub(op.Sub(a, op.Mul(half_integer, b_high)), op.Mul(half_integer, b_low))
        halved = op.Mul(floor, point_five)
        odd = op.Sub(halved, op.Floor(halved))  # 0 or 0.5
        # The ulp of |h| away from 0 (its successor minus it; |h| * PHI is exact).
        magnitude = op.Abs(half_integer)
        ulp = op.Sub(op.Add(magnitude, op.Mul(magnitude, op.Constant(value=phi))), magnitude)
        # RN(a / b) passes h towards the odd neighbour when a - h b is beyond b * ulp / 2 that way;
        # on h itself the tie goes to the even one.
        threshold = op.Mul(ulp, op.Sub(b_half, op.Mul(odd, b_twice)))
        up = op.Less(q_min, op.Sub(residual, threshold))
        step = op.Where(up, op.Add(offset, point_five), op.Sub(offset, point_five))
        return op.Add(half_integer, step), op.Less(magnitude, op.Constant(value=infinity))

    @onnxscript.script(default_opset=op)
    def portable(x: FLOAT[...]):
        x_min, x_max = extremes_never_empty(x)
        x_range = op.Sub(x_max, x_min)
        q_min = op.Constant(value=zero)
        q_max = op.Constant(value=qmax)
        unit = op.Constant(value=one)
        big = op.Constant(value=huge)
        small = op.Constant(value=tiny)
        inf = op.Constant(value=infinity)
        # A power of two k that brings the range into [2^-64, 2^64]: the scale times k lies in
        # [2^-85, 2^56], where no residual below is subnormal.
        below = op.Less(x_range, small)
        above = op.Less(big, x_range)
        k = op.Where(below, big, op.Where(above, small, unit))
        # A subnormal scale is rounded where it lies, with gradual underflow: scaled up, the
        # quotient would be rounded twice.
        subnormal = op.Less(x_range, op.Constant(value=subnormal_scale_range))
        k_inverse = op.Where(below, op.Where(subnormal, unit, small), op.Where(above, big, unit))
        scale_fp = op.Mul(quotient_by_qmax(op.Mul(x_range, op.Where(subnormal, unit, k))), k_inverse)
        # Less(0, range) rather than Equal(range, 0): right for -0 under an int32 compare too.
        zero_range_scale = op.Constant(value=zero_range_value)
        y_scale = op.Where(op.Less(x_range, inf), op.Where(op.Less(q_min, x_range), scale_fp, zero_range_scale), inf)
        # The divisor scaled by k and kept finite and non-zero: a scale of 0 or inf becomes 2^-100
        # or 2^100, which gives every finite quotient the saturated or zero answer it needs.
        scaled = op.Mul(y_scale, k)
        b = op.Clip(scaled, op.Constant(value=narrow), op.Constant(value=wide))
        # Veltkamp's split, with the product by 2^12 exact so that a fused sum changes nothing.
        t = op.Add(b, op.Mul(b, op.Constant(value=past_split)))
        b_high = op.Sub(t, op.Sub(t, b))
        b_low = op.Sub(b, b_high)
        b_half = op.Mul(b, op.Constant(value=half))
        b_twice = op.Mul(b, op.Constant(value=two))
        # zp = round(-x_min / scale); -inf / inf is not finite and saturates to 255, as 0/0 does.
        zero_point, finite = rounded_half_even(op.Sub(q_min, op.Mul(x_min, k)), b, b_high, b_low, b_half, b_twice,
                                               q_min)
        zero_point_sat = op.Clip(op.Where(finite, zero_point, q_max), q_min, q_max)
        scale_zero = op.Less(scaled, op.Constant(value=narrow))
        zero_point_out = op.Where(scale_zero, q_max, zero_point_sat)
        y_zero_point = op.Cast(zero_point_out, to=onnx.TensorProto.UINT8)
        # With scale 0, y is 255 for x > 0 and 0 for x <= 0 (0/0): the quotients over 2^-100
        # saturate, with a zero point of 0.
        offset = op.Where(scale_zero, q_min, zero_point_out)
        y_fp, x_finite = rounded_half_even(op.Mul(x, k), b, b_high, b_low, b_half, b_twice, offset)
        # An infinite x (only with an infinite scale) gives 0, as its NaN quotient does.
        y = op.Cast(op.Mul(op.Clip(y_fp, q_min, q_max), op.Where(x_finite, unit, q_min)), to=onnx.TensorProto.UINT8)
        return y, y_scale, y_zero_point

    # The lean variant: portable's guarantees (Div several ulp off, fused products, subnormals
    # flushed but for a subnormal x or y_scale; not comparisons of float bits as int32, since some
    # Less compare values of either sign) in 53 nodes, 50 of them kernels (a Reshape is none): 15
    # whole-tensor, 38 on scalars and on vectors of 769 slots built once per site. Per element: a
    # rough slot from Div, one Less against the exact threshold of that slot, one Gather of the
    # answer. A Gemm of [1, 1] by [1, n] plus C is a * b + c in one kernel, fused or not: each
    # product it takes is exact or rounded where a Mul would round it. Where the nodes go: 4
    # reductions (Reshape, Concat of a 0: WebGPU refuses an empty reduction); 11 per element (Mul
    # by k, Div, Add, 2 to clamp the slot: NaN, -inf and +inf all occur, Cast, Gather, Less, Cast,
    # Add, Gather); 18 for the scale (1 the range, 2 the zero range, 4 its exact rounding under a
    # GPU Div, 9 the powers of two that keep every residual normal and round a subnormal scale
    # once, 1 the cap of an infinite range, 1 a Reshape back to a scalar); 13 for the thresholds (a
    # Veltkamp split 3, the products and their sum 3, the exact residual test 3, the predecessor 3,
    # a Reshape to a vector 1); 7 for the zero point and the answer table (the count of thresholds
    # below x_min: 4, the table as a Gather of a constant clamp table at rows - count: 2, the zero
    # point's Gather 1). The scale 0 costs no node: its thresholds are 0 and NaN and its Div gives
    # +-inf or NaN, which the slot clamp and the table's ends answer. The floor: the thresholds
    # need b * c for 25-bit c to 48 bits (a split, two exact products, an exact residual and a
    # predecessor: one Mul by 1 - 2^-24 is the predecessor of f > 0 only, negative f would need a
    # factor between two floats; a Gemm of K = 2 sums its two products rounded, not exact), the
    # scale a correctly rounded quotient under a GPU Div (4), float32 without exponent access needs
    # Where over powers of two (two regimes' conditions, four factors, one node each whatever
    # picks them) to stay normal, and x = 0 under the scale 0 must reach a slot whose answer is not
    # the zero point, which only its NaN quotient does (so the clamp must catch NaN).
    (lean_h, lean_d, lean_sphi, lean_rows, lean_clamps, lean_slots, lean_centre,
     lean_zero_slot) = _lean_tables()
    policy_range = _tensor(255.0 if reference.zero_range_scale(zero_range) == 1 else 1.0)
    tiny_range, subnormal_range = _tensor(2.0**-70), _tensor(255 * 2.0**-126)
    up64, down64, down16, up16 = _tensor(2.0**64), _tensor(2.0**-64), _tensor(2.0**-16), _tensor(2.0**16)
    range_cap, splitter_power = _tensor(2.0**122), _tensor([[2.0**12]])
    qmax_2d, minus_just_past_qmax = _tensor([[255.0]]), _tensor([[-256.0]])
    reciprocal_qmax_2d, scalar_shape = _tensor([[np.float32(1) / np.float32(255)]]), _tensor([], np.int64)
    top_slot = _tensor(lean_slots - 1.0)

    @onnxscript.script(default_opset=op)
    def lean(x: FLOAT[...]):
        x_min, x_max = extremes_never_empty(x)  # 4 whole-tensor nodes
        x_range = op.Sub(x_max, x_min)
        q_min = op.Constant(value=zero)
        unit = op.Constant(value=one)
        # A zero range is rounded as the range whose scale the policy gives (255 or 1).
        x_range = op.Where(op.Less(q_min, x_range), x_range, op.Constant(value=policy_range))
        # Powers of two: k brings the scale (times k) into [2^-85, 2^104], where every residual
        # below is normal; a subnormal scale is rounded unscaled (gradual underflow), then scaled.
        small = op.Less(x_range, op.Constant(value=tiny_range))
        subnormal = op.Less(x_range, op.Constant(value=subnormal_range))
        k = op.Where(small, op.Constant(value=up64), op.Constant(value=down16))
        k_inverse = op.Where(small, op.Constant(value=down64), op.Constant(value=up16))
        # An infinite range is capped where its scale times k overflows back to inf below.
        a = op.Min(op.Mul(x_range, op.Where(subnormal, unit, k)), op.Constant(value=range_cap))
        # RN(a / 255) whatever Div returns within 2^14 ulp: the residual a - 255 q is exact. A
        # converter may make this Div a Mul by 1/255 (within 2 ulp: still exact, unless a compiler
        # then fuses that product into the sums that read q).
        # As Gemms: tract's Gemm reads a subnormal operand (q, the residual of a subnormal scale) as 0 (its
        # known difference), and OpenVINO's CPU plugin dies compiling the pair in some lowered models (a
        # failed run in its worker); lean is neither's target.
        q = op.Div(a, op.Constant(value=qmax_2d))  # [1, 1]: Gemm reads 2-D operands
        residual = op.Add(op.Gemm(q, op.Constant(value=minus_just_past_qmax), a), q)
        rounded_scale = op.Gemm(residual, op.Constant(value=reciprocal_qmax_2d), q)
        # b = y_scale * k: 0 for the scale 0 (a range below 2^-142), about 2^114 for an infinite one.
        b_2d = op.Mul(rounded_scale, op.Where(subnormal, op.Constant(value=up64), unit))
        b = op.Reshape(b_2d, op.Constant(value=scalar_shape))
        y_scale = op.Mul(b, k_inverse)
        # The thresholds T[s] = RD(b * c_s) in x * k's units, c_s the real that x / scale must pass
        # for round half to even of RN(x / scale) to reach s - centre + 1: h +- ulp(h) / 2 for
        # h = s - centre + 0.5, 25 bits, so b * c_s is never a float and x > T[s] says it. b =
        # b_high + b_low (13 bits at most each, h 10) makes b * h two exact products; F, one of the
        # two floats around b * c_s, is the threshold unless its exact residual F - b * h passes
        # b * (c_s - h): then its predecessor is. The split: RN(b + 4096 b) and 4096 b are both
        # multiples of 2^12 ulp(b), so b_high = RN(b + 4096 b) - 4096 b is exact, fused or not.
        splitter = op.Constant(value=splitter_power)
        b_high = op.Gemm(b_2d, splitter, op.Gemm(b_2d, splitter, b), alpha=-1.0)
        b_low = op.Sub(b_2d, b_high)
        offset = op.Mul(b, op.Constant(value=lean_d))
        h = op.Constant(value=lean_h)
        f = op.Gemm(b_high, h, op.Gemm(b_low, h, offset))
        over = op.Less(offset, op.Gemm(b_low, h, op.Gemm(b_high, h, f, alpha=-1.0), alpha=-1.0))
        thresholds = op.Reshape(op.Where(over, op.Sub(f, op.Mul(f, op.Constant(value=lean_sphi))), f),
                                op.Constant(value=flat))  # f - |f| * PHI
        # zp = min(255, -u(x_min)) = centre - count, the count of thresholds below x_min * k (129
        # of them -inf); a count of 0 (x_min = -inf, the scale 0) gives 255. The answers are a
        # slice of a constant clamp table: one int32 Sub and a Gather, no Clip nor Cast.
        count = op.ReduceSum(op.Cast(op.Less(thresholds, op.Mul(x_min, k)), to=onnx.TensorProto.INT32), keepdims=0)
        answers = op.Gather(op.Constant(value=lean_clamps), op.Sub(op.Constant(value=lean_rows), count))
        y_zero_point = op.Gather(answers, op.Constant(value=lean_zero_slot))  # u(0) = 0
        # Per element: the slot of x / scale (within a few ulp; Floor by the Cast of a value >= 0),
        # then one step up where x is past the slot's threshold. Below 0, -inf and NaN (0 / 0 under
        # the scale 0, outside the contract as input, but every form must run on it) take slot 0.
        x_k = op.Mul(x, k)
        estimate = op.Add(op.Div(x_k, b), op.Constant(value=lean_centre))
        # ThresholdedRelu is Where(0 < v, v, 0) in one kernel: NaN fails the compare (not so Relu's
        # max(v, 0) on a CPU, nor Clip's).
        clamped = op.Min(op.ThresholdedRelu(estimate, alpha=0.0), op.Constant(value=top_slot))
        slot = op.Cast(clamped, to=onnx.TensorProto.INT32)
        up = op.Cast(op.Less(op.Gather(thresholds, slot), x_k), to=onnx.TensorProto.INT32)
        y = op.Gather(answers, op.Add(slot, up))
        return y, y_scale, y_zero_point

    # The body of each variant is the function of its name; variants.NAMES says which there are.
    defined = {function.name: function for function in (quantizelinear, arithmetic, float64, residual, portable, lean)}
    return {name: defined[name] for name in variants.NAMES}
