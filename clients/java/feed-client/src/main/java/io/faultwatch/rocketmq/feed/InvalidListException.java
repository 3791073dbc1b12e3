package io.faultwatch.rocketmq.feed;

/** A record that is not an avoidance list of this wire version; the message names the bad field. */
public final class InvalidListException extends Exception {
    public InvalidListException(String message) {
        super(message);
    }
}
