package ruleplatform.keyed;

import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;

/**
 * Python's float arithmetic where the JVM's differs: {@code math.fsum} (correctly rounded
 * exact sum) and {@code repr(float)} (shortest round-trip text, as json.dumps writes it).
 * Public so that a test can hold them against Python's own (test_jvm_keyed_operator.py).
 */
public final class PyMath {
    private PyMath() {}

    /**
     * math.fsum: the exact sum rounded once. Finite values are summed exactly in BigDecimal
     * ({@code new BigDecimal(double)} is exact) and rounded by doubleValue (correctly
     * rounded). Non-finite values follow CPython: any NaN gives NaN, +inf and -inf together
     * raise ValueError, otherwise the infinity. A finite exact sum beyond the double range
     * raises OverflowError as CPython does (CPython also raises when only an intermediate
     * partial overflows; values near 1e308 are not expected in events).
     */
    public static double fsum(double[] xs, int from, int to) {
        BigDecimal acc = BigDecimal.ZERO;
        double special = 0.0;
        double infSum = 0.0;
        boolean anySpecial = false;
        for (int i = from; i < to; i++) {
            double x = xs[i];
            if (Double.isFinite(x)) {
                if (x != 0.0) {
                    acc = acc.add(new BigDecimal(x));
                }
            } else {
                anySpecial = true;
                special += x;
                if (Double.isInfinite(x)) {
                    infSum += x;
                }
            }
        }
        return finish(acc, anySpecial, special, infSum);
    }

    static double finish(BigDecimal acc, boolean anySpecial, double special, double infSum) {
        if (anySpecial) {
            if (Double.isNaN(infSum)) {
                throw new PyError("ValueError", "-inf + inf in fsum");
            }
            return special;
        }
        double d = acc.doubleValue();
        if (Double.isInfinite(d)) {
            throw new PyError("OverflowError", "intermediate overflow in fsum");
        }
        return d;
    }

    /** {@code x ** 2} of Python: an overflow of a finite base raises OverflowError. */
    static double square(double x) {
        double y = x * x;
        if (Double.isInfinite(y) && Double.isFinite(x)) {
            throw new PyError("OverflowError", "(34, 'Numerical result out of range')");
        }
        return y;
    }

    /** json.dumps of a float: Python's repr, NaN and Infinity as json writes them. */
    static String jsonFloat(double x) {
        if (Double.isNaN(x)) {
            return "NaN";
        }
        if (Double.isInfinite(x)) {
            return x > 0 ? "Infinity" : "-Infinity";
        }
        return repr(x);
    }

    /**
     * repr(float): the shortest decimal that reads back as x (nearest to x among the
     * shortest), written as CPython's float_repr_style "short" does: exponent form when
     * the decimal point is more than 16 digits right or 4 or more left of the first digit.
     */
    public static String repr(double x) {
        if (x == 0.0) {
            return (1.0 / x < 0) ? "-0.0" : "0.0";
        }
        String sign = x < 0 ? "-" : "";
        BigDecimal exact = new BigDecimal(Math.abs(x));
        double ax = Math.abs(x);
        BigDecimal best = null;
        for (int p = 1; p <= 17 && best == null; p++) {
            MathContext[] modes = {
                new MathContext(p, RoundingMode.HALF_EVEN),
                new MathContext(p, RoundingMode.FLOOR),
                new MathContext(p, RoundingMode.CEILING),
            };
            for (MathContext mc : modes) {
                BigDecimal c = exact.round(mc);
                if (c.doubleValue() == ax) {
                    if (best == null || c.subtract(exact).abs().compareTo(best.subtract(exact).abs()) < 0) {
                        best = c;
                    }
                }
            }
        }
        best = best.stripTrailingZeros();
        String digits = best.unscaledValue().toString();
        int decpt = digits.length() - best.scale();
        StringBuilder sb = new StringBuilder(sign);
        if (decpt <= -4 || decpt > 16) {
            sb.append(digits.charAt(0));
            if (digits.length() > 1) {
                sb.append('.').append(digits, 1, digits.length());
            }
            int e = decpt - 1;
            sb.append('e').append(e < 0 ? '-' : '+');
            int ae = Math.abs(e);
            if (ae < 10) {
                sb.append('0');
            }
            sb.append(ae);
        } else if (decpt <= 0) {
            sb.append("0.");
            for (int i = 0; i < -decpt; i++) {
                sb.append('0');
            }
            sb.append(digits);
        } else if (decpt >= digits.length()) {
            sb.append(digits);
            for (int i = digits.length(); i < decpt; i++) {
                sb.append('0');
            }
            sb.append(".0");
        } else {
            sb.append(digits, 0, decpt).append('.').append(digits, decpt, digits.length());
        }
        return sb.toString();
    }
}
