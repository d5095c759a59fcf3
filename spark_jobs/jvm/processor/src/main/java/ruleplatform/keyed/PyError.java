package ruleplatform.keyed;

/**
 * An error the Python processor raises at the same point, with Python's exception name and
 * message: a key whose evaluation fails is dead-lettered with
 * "rule evaluation failed: {type}: {message}" (processor.py handleInputRows), and the JVM
 * operator must write the same text.
 */
final class PyError extends RuntimeException {
    private static final long serialVersionUID = 1L;
    final String pyType;

    PyError(String pyType, String message) {
        super(message);
        this.pyType = pyType;
    }

    /** The dead letter's reason for any failure of one key's evaluation. */
    static String reason(Throwable e) {
        String type = e instanceof PyError ? ((PyError) e).pyType : e.getClass().getSimpleName();
        String msg = String.valueOf(e.getMessage() == null ? "" : e.getMessage());
        if (msg.length() > 300) {
            msg = msg.substring(0, 300);
        }
        return "rule evaluation failed: " + type + ": " + msg;
    }
}
