package ruleplatform.keyed;

import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;

/**
 * How a double is written as a JSON number in a detection record (the `mean` and `std`
 * of a mean_std context record, docs/rule-language.md "The detection record"): the
 * shortest decimal that reads back as the value, with ".0" on integral values and an
 * exponent outside [1e-4, 1e16) (`20.0`, `0.7071067811865476`, `1e+16`). Public so that
 * a test can hold it against a reference.
 */
public final class JsonNumbers {
    private JsonNumbers() {}

    /** x as JSON number text; NaN and the infinities as the JSON extension writes them. */
    static String json(double x) {
        if (Double.isNaN(x)) {
            return "NaN";
        }
        if (Double.isInfinite(x)) {
            return x > 0 ? "Infinity" : "-Infinity";
        }
        return shortest(x);
    }

    /**
     * The shortest decimal that reads back as x (nearest to x among the shortest), in
     * exponent form when the decimal point is more than 16 digits right or 4 or more left
     * of the first digit.
     */
    public static String shortest(double x) {
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
