"""Write the labelled sets in this folder from hand-written templates (deterministic).

    .venv/bin/python tests/data/build_sets.py

Every state is one to three sentences whose gold answer is obvious to a person;
slots (order numbers, products, amounts, places) give variety without changing
the answer. Choice options are shown in a seeded random order per item, so the
gold answer sits at every position.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

ORDERS = ["4411", "10293", "88-2201", "A7731", "5520", "30018", "7716", "12045", "9982", "61-0047"]
PRODUCTS = [
    "blender",
    "desk lamp",
    "pair of running shoes",
    "coffee grinder",
    "phone case",
    "rain jacket",
    "set of kitchen knives",
    "yoga mat",
    "bluetooth speaker",
    "backpack",
    "winter coat",
    "electric kettle",
]
AMOUNTS = ["$12.99", "$49.00", "€35.50", "£18.20", "$120.00", "€7.90", "$64.15", "£230.00"]
CITIES = ["Leeds", "Lyon", "Denver", "Porto", "Graz", "Osaka", "Tampere", "Cork"]
DEVICES = ["iPhone", "Android phone", "iPad", "Windows laptop", "Chromebook", "MacBook"]
BROWSERS = ["Firefox", "Chrome", "Safari", "Edge"]
CODES = ["500", "E-1043", "403", "0x80070005", "TIMEOUT_12", "502"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
EMAILS = [
    "ana.reyes@example.com",
    "j.kowalski@example.org",
    "mina@example.net",
    "tom.h@example.com",
]

TICKETS = {
    "billing": [
        "I was charged twice for order {order}. Please refund one of the two payments of {amount}.",
        "My invoice for last month says {amount}, but my plan costs less than that. Please correct the invoice.",
        "The refund you promised for order {order} has still not reached my credit card.",
        "You billed my card {amount} after I had already cancelled the subscription. I want that money back.",
        "Could you send me a VAT invoice for my payment of {amount}? My accountant needs it.",
        "Your checkout declined my card, but the bank shows the {amount} was taken anyway.",
        "Please charge my new Visa card from now on instead of the old Mastercard; the next payment is {amount}.",
        "There is a charge of {amount} on my statement that I do not recognise. What is it for?",
        "I paid {amount} for the yearly plan but I am still being charged every month.",
        "The discount code was accepted, yet I paid the full price of {amount}. Please refund the difference.",
        "I returned the {product} two weeks ago and have not been refunded the {amount}.",
        "Why does my receipt show sales tax twice? The total of {amount} is wrong.",
    ],
    "shipping": [
        "My parcel for order {order} has been stuck in {city} for five days according to tracking.",
        "The tracking number you emailed for order {order} does not work on the courier's website.",
        "The box arrived crushed and the {product} inside was broken in transit.",
        "Can you deliver order {order} to my office instead of my home address?",
        "The courier left my package for order {order} with the wrong neighbour and now nobody can find it.",
        "Order {order} was supposed to arrive on {day} but it still has not been delivered.",
        "I only received one of the two boxes for order {order}. Where is the second parcel?",
        "Do you ship to {city}? I cannot pick it as a delivery destination.",
        "The delivery driver marked my {product} as delivered, but nothing came to my door.",
        "I need the {product} before {day}. Can you upgrade the delivery to express?",
        "My parcel for order {order} was sent back to your warehouse because the courier said my address was incomplete.",
        "The package for order {order} has been 'out for delivery' for three days now.",
    ],
    "technical": [
        "The app crashes every time I open the settings page on my {device}.",
        "I get error {code} whenever I try to upload a photo on your website.",
        "The website shows a blank white page in {browser} after the last update.",
        "Syncing between my phone and my {device} stopped working after the latest app update.",
        "The search bar on your site returns no results in {browser}, even for products I can see on the homepage.",
        "Push notifications no longer appear on my {device} although they are switched on in the app.",
        "The page keeps loading forever and then shows error {code}. I tried {browser} and another browser.",
        "Since updating the app on my {device}, the screen freezes as soon as I scroll down.",
        "The export to PDF button does nothing when I click it in {browser}.",
        "Videos in the app play without sound on my {device}; other apps are fine.",
        "The app shows error {code} on start-up and closes immediately.",
        "Images on your product pages are broken in {browser}; only grey boxes appear.",
    ],
    "account": [
        "I forgot my password and the reset email never arrives at {email}. How can I get back into my account?",
        "Please change the email address on my account to {email}.",
        "I want to delete my account ({email}) and all the personal data you hold about me.",
        "My account was locked on {day} after I typed the wrong password three times.",
        "How do I turn on two-factor authentication for my login? I use an {device}.",
        "I would like to change my username; the old one has a typo. My email is {email}.",
        "Someone else seems to have logged into my account from {city}. Please secure it.",
        "I have two accounts by mistake. Can you merge them into the one registered to {email}?",
        "The verification code for signing in never comes to my {mobile}, so I cannot log in.",
        "Please update the name on my profile ({email}); I got married and my surname has changed.",
        "How can I close my account? I moved to {city} and no longer use your service.",
        "Since {day} I cannot log in with Google any more; it says my account is not linked.",
    ],
}

TICKET_OPTIONS = [
    {
        "billing": "charges, refunds, invoices, payment methods",
        "shipping": "parcels, delivery, tracking, damaged in transit",
        "technical": "errors, crashes, bugs in the app or website",
        "account": "login, password, profile details, deleting the account",
    },
    {
        "billing": "money: payments, refunds and invoices",
        "shipping": "getting the order to the customer",
        "technical": "something in the app or website does not work",
        "account": "sign-in, security and profile settings",
    },
    {"billing": None, "shipping": None, "technical": None, "account": None},
]
TICKET_INSTRUCTIONS = [
    "Which team should handle this support ticket?",
    "Route this customer message to the right queue.",
    None,
]

POSITIVE = [
    "I love this {product}. It works perfectly and looks great.",
    "Best purchase I have made this year. The {product} exceeded my expectations.",
    "The {product} arrived early and works beautifully. Highly recommended!",
    "Fantastic quality for the price. I would happily buy this {product} again.",
    "My {product} is excellent: sturdy, quiet and easy to use. Five stars.",
    "Really pleased with the {product}. It does exactly what I wanted.",
    "Wonderful! The {product} is even better than the photos suggested.",
    "Great {product}, great service, and a friendly note in the box. Thank you!",
    "I am delighted with this {product}; my whole family uses it every day.",
    "Superb {product}. Setup took two minutes and it has worked flawlessly since.",
]
NEGATIVE = [
    "Terrible {product}. It broke after two days and support ignored me.",
    "I regret buying this {product}. It is flimsy and does not work properly.",
    "Awful quality. The {product} stopped working within a week.",
    "Very disappointed: the {product} looks nothing like the pictures and feels cheap.",
    "Do not buy this {product}. It is noisy, slow and a waste of money.",
    "The {product} arrived broken and the replacement is broken too. Useless.",
    "Worst purchase ever. The {product} fell apart the first time I used it.",
    "I hate this {product}. It is uncomfortable and I am returning it.",
    "Poor {product}: it overheats and smells of burning plastic. Never again.",
    "Completely unhappy with the {product}. It failed on day one and nobody answers my emails.",
]
NEUTRAL = [
    "I ordered the {product} on {day}. It was delivered on {day2}.",
    "The {product} is the model I ordered. I have not used it yet.",
    "I received the {product} today. I will try it at the weekend.",
    "The {product} came in a cardboard box with a manual in three languages.",
    "My order contained one {product} and the receipt for {amount}.",
    "I bought the {product} as a gift, so I have not seen it in use.",
    "The {product} is grey and measures about thirty centimetres.",
    "I picked up the {product} from the store in {city} on {day}.",
    "This is the second {product} I have ordered from this shop. It arrived in a standard box.",
    "The {product} uses a standard plug and comes with a one-year warranty card.",
]

# question -> (states where the answer is yes, states where it is no)
YES_NO = {
    "Has the order been delivered?": (
        [
            "Order {order} was delivered on {day} and signed for at the front door.",
            "The courier dropped off my {product} this morning. It is here.",
            "Tracking for order {order} says delivered, and I have the parcel in my hands.",
            "My {product} arrived on {day}, right on time.",
            "Got the parcel for order {order} yesterday, thanks.",
        ],
        [
            "Order {order} is still waiting at the warehouse in {city}.",
            "My {product} has not arrived yet; tracking shows it left {city} on {day}.",
            "The parcel for order {order} was lost by the courier and never reached me.",
            "I am still waiting for order {order}. Nothing has come.",
            "Delivery of my {product} is planned for next {day}.",
        ],
    ),
    "Does the customer ask for money back?": (
        [
            "Please refund the {amount} I paid for the broken {product}.",
            "I want my money back for order {order}.",
            "Return the {amount} to my card, please; the {product} never worked.",
            "Can I get a full refund for the {product}? I am not happy with it.",
            "I expect the {amount} to be credited back to my account.",
        ],
        [
            "Please send me a replacement {product}; I do not want a refund.",
            "How do I change the colour of the {product} I ordered?",
            "Thanks, the {product} works great.",
            "Could you tell me when order {order} will ship?",
            "I would like to add a second {product} to order {order}.",
        ],
    ),
    "Is the customer happy with the product?": (
        [
            "The {product} is wonderful, thank you so much!",
            "Really happy with my new {product}. It works perfectly.",
            "Love the {product}. Best purchase this year.",
            "The {product} is excellent and I will recommend it to friends.",
            "Great {product}. Exactly what I needed.",
        ],
        [
            "The {product} broke on the first day. I am very annoyed.",
            "I am disappointed with the {product}; it feels cheap.",
            "This {product} is useless and I want to return it.",
            "The {product} is awful and the instructions make no sense.",
            "Terrible {product}. It stopped working after an hour.",
        ],
    ),
    "Does the message mention a specific date or weekday?": (
        [
            "I need the {product} by {day}.",
            "Please call me back on {day} after lunch.",
            "My order {order} was placed on {day}.",
            "The {product} arrived on {day} but the box was empty.",
            "I will be away until {day}, so deliver after that.",
        ],
        [
            "I need the {product} soon.",
            "Please call me back about order {order} when you can.",
            "My order {order} was placed a while ago.",
            "The {product} arrived but the box was empty.",
            "I will be away for a bit, so deliver later.",
        ],
    ),
    "Does the customer want to cancel something?": (
        [
            "Please cancel order {order}; I ordered it by mistake.",
            "I want to cancel my {product} subscription at the end of this month.",
            "Cancel the {product} from my order, please.",
            "Can you stop order {order} before it ships? I no longer need it.",
            "Please cancel my membership; I am moving to {city}.",
        ],
        [
            "Please add a gift wrap to order {order}.",
            "When will the {product} be back in stock?",
            "I would like to renew my {product} subscription for another year.",
            "Can you ship order {order} faster? I really need it.",
            "Please keep my membership active while I am in {city}.",
        ],
    ),
    "Is a phone or tablet mentioned?": (
        [
            "The app crashes on my {mobile}.",
            "I ordered a case for my {mobile} but it does not fit.",
            "Your website looks broken on my {mobile}.",
            "My {mobile} will not pair with the {product}.",
            "I took a photo of the damage with my {mobile}.",
        ],
        [
            "The {product} arrived scratched.",
            "My invoice shows the wrong amount of {amount}.",
            "Order {order} has not arrived in {city}.",
            "The {product} is too big for my kitchen.",
            "I would like to change the delivery address for order {order}.",
        ],
    ),
    "Did the customer receive a damaged item?": (
        [
            "The {product} arrived with a cracked lid.",
            "My {product} came broken in two pieces.",
            "The box for order {order} was soaked and the {product} inside is ruined.",
            "The screen of the {product} was shattered when I opened the parcel.",
            "Half of the {product} was dented on arrival.",
        ],
        [
            "The {product} arrived in perfect condition.",
            "Everything in order {order} was intact and works well.",
            "My {product} came well packed and undamaged.",
            "The {product} has not been shipped yet.",
            "I received the {product} and it looks brand new.",
        ],
    ),
    "Is the customer asking a question?": (
        [
            "Do you ship to {city}?",
            "How long does delivery of order {order} take?",
            "Is the {product} available in blue?",
            "Can I pay for the {product} with a bank transfer?",
            "What is the warranty period for the {product}?",
        ],
        [
            "I received the {product}. Thanks.",
            "My order number is {order}.",
            "The {product} works well.",
            "I paid {amount} yesterday.",
            "I live in {city}.",
        ],
    ),
    "Is an amount of money mentioned?": (
        [
            "I paid {amount} for the {product}.",
            "The invoice for order {order} says {amount}.",
            "You charged me {amount} twice.",
            "Is the {product} still {amount}?",
            "My refund of {amount} has not arrived.",
        ],
        [
            "I paid for the {product} last week.",
            "The invoice for order {order} is wrong.",
            "You charged me twice for order {order}.",
            "Is the {product} still on sale?",
            "My refund for the {product} has not arrived.",
        ],
    ),
    "Does the customer report a problem with logging in?": (
        [
            "I cannot log in to my account on my {mobile}; it says my password is wrong.",
            "The login page rejects {email} although I am registered.",
            "After the update I am unable to sign in on my {mobile}.",
            "My account is locked since {day} and I cannot get in.",
            "The two-factor code never arrives on my {mobile}, so I cannot sign in.",
        ],
        [
            "I logged in without trouble and updated my address to {city}.",
            "The {product} I ordered is the wrong size.",
            "Please send me the invoice for order {order}.",
            "I signed in on {day} and everything looks fine, thanks.",
            "My parcel for order {order} is late.",
        ],
    ),
}
MOBILES = ["iPhone", "Android phone", "iPad", "Samsung tablet", "Pixel phone"]


_SEEN: set[tuple[str, str]] = set()


def _fill(template: str, rng: random.Random, question: str = "") -> str:
    """The template with random slot values, never the same text twice for one question."""
    for _ in range(100):
        text = _slots(template, rng)
        if (text, question) not in _SEEN:
            _SEEN.add((text, question))
            return text
    raise RuntimeError(f"too few slot values to vary {template!r}")


def _slots(template: str, rng: random.Random) -> str:
    day, day2 = rng.sample(DAYS, 2)
    return template.format(
        order=rng.choice(ORDERS),
        product=rng.choice(PRODUCTS),
        amount=rng.choice(AMOUNTS),
        city=rng.choice(CITIES),
        device=rng.choice(DEVICES),
        browser=rng.choice(BROWSERS),
        code=rng.choice(CODES),
        day=day,
        day2=day2,
        email=rng.choice(EMAILS),
        mobile=rng.choice(MOBILES),
    )


def _shuffled(options: dict, rng: random.Random) -> dict:
    names = list(options)
    rng.shuffle(names)
    return {n: options[n] for n in names}


def tickets(rng: random.Random) -> list[dict]:
    out = []
    for rep in range(3):
        for team, templates in TICKETS.items():
            for i, template in enumerate(templates):
                if (i + rep) % 4 == 3:  # 9 of 12 templates per pass: 27 items per team
                    continue
                q = {"type": "choice", "criteria": _shuffled(TICKET_OPTIONS[(i + rep) % 3], rng)}
                instructions = TICKET_INSTRUCTIONS[(i + 2 * rep) % 3]
                if instructions:
                    q["instructions"] = instructions
                out.append(
                    {"state": _fill(template, rng, "team"), "questions": {"team": q}, "gold": team}
                )
    return out


def sentiment(rng: random.Random) -> list[dict]:
    out = []
    choice = {"positive": "the customer is pleased", "negative": "the customer is unhappy"}
    for _rep in range(3):
        for label, templates in (("positive", POSITIVE), ("negative", NEGATIVE)):
            for template in templates:
                q = {
                    "type": "choice",
                    "instructions": "What is the sentiment of this review?",
                    "criteria": _shuffled(choice, rng),
                }
                out.append(
                    {
                        "state": _fill(template, rng, "sentiment"),
                        "questions": {"sentiment": q},
                        "gold": label,
                    }
                )
    levels = ["unhappy", "neither happy nor unhappy", "happy"]
    for _rep in range(2):
        for gold, templates in ((0, NEGATIVE), (1, NEUTRAL), (2, POSITIVE)):
            for template in templates:
                q = {
                    "type": "score",
                    "instructions": "How does the customer feel?",
                    "criteria": levels,
                }
                out.append(
                    {"state": _fill(template, rng, "mood"), "questions": {"mood": q}, "gold": gold}
                )
    return out


def yes_no(rng: random.Random) -> list[dict]:
    out = []
    for rep in range(2):
        for question, (yes, no) in YES_NO.items():
            for gold, states in ((True, yes), (False, no)):
                for state in states:
                    if rep == 1 and rng.random() < 0.5:
                        continue  # the second pass keeps about half, for variety in size
                    q = {"type": "noul", "instructions": question}
                    out.append(
                        {
                            "state": _fill(state, rng, question),
                            "questions": {"answer": q},
                            "gold": gold,
                        }
                    )
    return out


def _write(name: str, rows: list[dict], rng: random.Random) -> None:
    rng.shuffle(rows)
    with open(HERE / name, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{name}: {len(rows)} items")


def main() -> None:
    rng = random.Random(20261130)
    _write("tickets.jsonl", tickets(rng), rng)
    _write("sentiment.jsonl", sentiment(rng), rng)
    _write("yesno.jsonl", yes_no(rng), rng)


if __name__ == "__main__":
    main()
