package ruleplatform.keyed;

/**
 * What one key's evaluation cannot compute (a sum beyond the double range, a context
 * value that is not JSON, ...), in plain words: the key's rows are dead-lettered with
 * "rule evaluation failed: {message}" (docs/rule-language.md, "Dead letters") and its
 * state stays as it was.
 */
final class EvaluationError extends RuntimeException {
    private static final long serialVersionUID = 1L;

    EvaluationError(String message) {
        super(message);
    }

    /** The dead letter's reason for any failure of one key's evaluation. */
    static String reason(Throwable e) {
        String msg = e.getMessage() == null ? "" : e.getMessage();
        if (!(e instanceof EvaluationError)) { // unforeseen: say which error it was
            msg = e.getClass().getSimpleName() + (msg.isEmpty() ? "" : ": " + msg);
        }
        if (msg.length() > 300) {
            msg = msg.substring(0, 300);
        }
        return "rule evaluation failed: " + msg;
    }
}
