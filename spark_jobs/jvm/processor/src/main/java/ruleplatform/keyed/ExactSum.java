package ruleplatform.keyed;

import java.math.BigDecimal;

/**
 * The exact sum of doubles, rounded once: finite values are summed exactly in BigDecimal
 * ({@code new BigDecimal(double)} is exact) and rounded by doubleValue (correctly
 * rounded), so the result does not depend on the order of the values. Public so that a
 * test can hold it against an exact reference.
 */
public final class ExactSum {
    private ExactSum() {}

    /**
     * The sum of xs[from, to). Any NaN gives NaN, an infinity gives that infinity; +inf
     * and -inf together, or a finite exact sum beyond the double range, cannot be
     * evaluated (EvaluationError).
     */
    public static double of(double[] xs, int from, int to) {
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

    /** The exact finite sum `acc` with the non-finite values (their sum `special`) as a double. */
    static double finish(BigDecimal acc, boolean anySpecial, double special, double infSum) {
        if (anySpecial) {
            if (Double.isNaN(infSum)) {
                throw new EvaluationError("the values to sum hold both +Infinity and -Infinity");
            }
            return special;
        }
        double d = acc.doubleValue();
        if (Double.isInfinite(d)) {
            throw new EvaluationError("sum exceeds the double range");
        }
        return d;
    }
}
