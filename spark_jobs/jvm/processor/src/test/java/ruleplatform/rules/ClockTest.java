package ruleplatform.rules;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** A detection's `processed` text: ISO-8601 UTC with milliseconds (docs/rule-language.md). */
class ClockTest {
    @Test
    void rendersUtcWithMilliseconds() {
        assertEquals("1970-01-01T00:00:00.000Z", Clock.render(0L));
        // 1,700,000,000 s after the epoch is 2023-11-14 22:13:20 UTC.
        assertEquals("2023-11-14T22:13:20.123Z", Clock.render(1_700_000_000_123L));
        assertEquals("2023-11-14T22:13:20.124Z", Clock.render(1_700_000_000_124L));
        assertEquals("2023-11-14T22:13:20.123Z", Clock.render(1_700_000_000_123L));
    }

    @Test
    void readsTheClockNow() {
        long before = System.currentTimeMillis();
        String now = Clock.now();
        long after = System.currentTimeMillis();
        assertTrue(now.compareTo(Clock.render(before)) >= 0 && now.compareTo(Clock.render(after)) <= 0, now);
    }
}
